"""Two front-ends (uvicorn servers, each with its own engine) sharing one job store and one media folder:
whatever is made on one is polled, listed, fetched, deleted on the other, and a DELETE on one stops the job
on the one running it. SQLite and a real Redis server; the front-ends run in this process, so the test can
see the engine's running requests (tests/server/fleet/test_fleet_processes.py runs real `omnistage serve`)."""

from __future__ import annotations

import contextlib
import time

import pytest

from omnistage.config.settings import ServerSettings
from omnistage.testing.server import serve_engine
from tests.server.conftest import error_of, new_engine
from tests.server.fleet.stores import needs_redis
from tests.server.pipelines import GATE, omni_pipeline

BACKENDS = ["sqlite", pytest.param("redis", marks=needs_redis)]
VIDEO = {"prompt": "a cat", "size": "16x16", "num_frames": 3, "seed": 1}


@pytest.fixture(autouse=True)
def _gate():
    GATE.clear()
    yield
    GATE.set()


@contextlib.contextmanager
def front_ends(job_store: str, folder, n: int = 2):
    settings = ServerSettings(storage={"path": str(folder)}, job_store=job_store, job_lease_s=3)
    servers = []
    try:
        for _ in range(n):
            servers.append(
                serve_engine(new_engine(omni_pipeline()), settings, served_model_name="omni", shutdown_grace_s=0.5)
            )
        yield servers
    finally:
        GATE.set()
        for s in servers:
            s.stop()


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/jobs.db"
    server = request.getfixturevalue("redis_server")
    import redis

    redis.Redis.from_url(server.url).flushdb()  # (one server for the module)
    return server.url


def wait_for(get, cond, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if cond(value):
            return value
        assert time.monotonic() < deadline, value
        time.sleep(0.05)


def test_a_job_made_on_one_front_end_is_served_by_the_other(store_url, tmp_path):
    with front_ends(store_url, tmp_path / "media") as (a, b):
        ca, cb = a.client(), b.client()
        job = ca.post("/v1/videos", json=VIDEO).json()
        url = f"/v1/videos/{job['id']}"
        done = wait_for(lambda: cb.get(url).json(), lambda j: j["status"] == "completed")
        assert done["progress"] == 100 and done["prompt"] == "a cat"
        content = cb.get(f"{url}/content")
        assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
        assert content.content == ca.get(f"{url}/content").content and content.content[4:8] == b"ftyp"
        part = cb.get(f"{url}/content", headers={"Range": "bytes=4-11"})  # a player seeking
        size = len(content.content)
        assert part.status_code == 206 and part.content == content.content[4:12]
        assert part.headers["content-range"] == f"bytes 4-11/{size}"
        assert cb.get(f"{url}/content", headers={"Range": f"bytes={size}-"}).status_code == 416
        second = ca.post("/v1/videos", json={**VIDEO, "prompt": "a dog"}).json()
        wait_for(lambda: cb.get(f"/v1/videos/{second['id']}").json(), lambda j: j["status"] == "completed")
        for c in (ca, cb):  # both list both, newest first, one page at a time
            page = c.get("/v1/videos", params={"limit": 1}).json()
            assert [j["id"] for j in page["data"]] == [second["id"]] and page["has_more"]
            rest = c.get("/v1/videos", params={"limit": 1, "after": page["last_id"]}).json()
            assert [j["id"] for j in rest["data"]] == [job["id"]] and not rest["has_more"]
        assert cb.delete(url).json()["deleted"] is True
        for c in (ca, cb):
            assert error_of(c.get(url))["code"] == "video_not_found"
            assert c.get(f"{url}/content").status_code == 404 and c.delete(url).status_code == 404
        assert not (tmp_path / "media" / f"{job['id']}.mp4").exists()
        assert [j["id"] for j in ca.get("/v1/videos").json()["data"]] == [second["id"]]


def test_a_delete_on_one_front_end_stops_the_job_on_the_other(store_url, tmp_path):
    with front_ends(store_url, tmp_path / "media") as (a, b):
        job = a.client().post("/v1/videos", json={**VIDEO, "prompt": "block: a dog"}).json()
        wait_for(lambda: a.engine.running_requests(), lambda running: job["id"] in running)
        assert b.client().get(f"/v1/videos/{job['id']}").json()["status"] in ("queued", "in_progress")
        assert b.client().delete(f"/v1/videos/{job['id']}").json()["deleted"] is True
        # A learns it at its next lease renewal (at most a second here) and aborts the request in its engine
        wait_for(lambda: a.engine.running_requests(), lambda running: job["id"] not in running, timeout=15)
        wait_for(lambda: a.state.videos, lambda videos: job["id"] not in videos)
        assert a.client().get(f"/v1/videos/{job['id']}").status_code == 404  # and it wrote nothing back


def test_unknown_ids_are_404_on_every_front_end(store_url, tmp_path):
    with front_ends(store_url, tmp_path / "media") as servers:
        for srv in servers:
            c = srv.client()
            for job_id in ("video_" + "0" * 32, "video_x", "../etc/passwd"):
                assert c.get(f"/v1/videos/{job_id}").status_code == 404
                assert c.delete(f"/v1/videos/{job_id}").status_code == 404
