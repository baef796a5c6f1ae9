"""Faults: a job store that goes away while serving turns async requests into 503s naming it (the synchronous
routes keep working) and the front-end recovers when it is back; a store that cannot be reached at start-up is
a clear error naming its URL, before any model loads."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from omnistage.config.settings import ServerSettings
from omnistage.testing.server import free_port, serve_engine
from tests.server.conftest import error_of, new_engine
from tests.server.fleet.stores import AWS, RedisServer, needs_redis
from tests.server.pipelines import GATE, omni_pipeline

VIDEO = {"prompt": "a cat", "size": "16x16", "num_frames": 3, "seed": 1}


@pytest.fixture(autouse=True)
def _gate():
    GATE.set()  # nothing here blocks
    yield


def wait_status(client, job_id: str, status: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while (job := client.get(f"/v1/videos/{job_id}").json())["status"] != status:
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    return job


@needs_redis
def test_a_store_that_goes_away_is_a_503_naming_it_until_it_is_back(tmp_path):
    redis_server = RedisServer(tmp_path).start()
    settings = ServerSettings(storage={"path": str(tmp_path / "media")}, job_store=redis_server.url, job_lease_s=3)
    try:
        with serve_engine(new_engine(omni_pipeline()), settings, served_model_name="omni") as srv:
            c = srv.client()
            before = c.post("/v1/videos", json=VIDEO).json()
            wait_status(c, before["id"], "completed")
            redis_server.stop()
            for resp in (c.post("/v1/videos", json=VIDEO), c.get(f"/v1/videos/{before['id']}"), c.get("/v1/videos")):
                err = error_of(resp)
                assert resp.status_code == 503 and err["code"] == "store_unavailable", resp.text
                assert redis_server.url in err["message"] and resp.headers["retry-after"]
            sync = c.post("/v1/videos/sync", json=VIDEO)  # needs no store
            assert sync.status_code == 200 and sync.headers["content-type"] == "video/mp4"
            assert c.get("/health").status_code == 200
            redis_server.start()  # the same port; an empty store (no persistence)
            after = c.post("/v1/videos", json=VIDEO)
            assert after.status_code == 200, after.text
            assert wait_status(c, after.json()["id"], "completed")["progress"] == 100
            assert c.get(f"/v1/videos/{before['id']}").status_code == 404  # lost with the store's data
    finally:
        redis_server.stop()


def serve_exit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "omnistage.cli.main", "serve", "--port", str(free_port()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.slow  # a fresh interpreter's imports (~10 s)
def test_an_unreachable_job_store_at_start_up_is_an_error_naming_it(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = serve_exit("--job-store", url)
    assert done.returncode == 2 and f"error: the job store {url} is unreachable" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    done = serve_exit("--job-store", "mongodb://somewhere")
    assert done.returncode == 2 and "mongodb://somewhere" in done.stderr


@pytest.mark.slow
def test_an_unreachable_media_store_at_start_up_is_an_error_naming_it(tmp_path):
    import os

    env = {**os.environ, **AWS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_MAX_ATTEMPTS": "1"}
    done = serve_exit("--job-store", f"sqlite:///{tmp_path}/jobs.db", "--media-store", "s3://outputs/v", env=env)
    assert done.returncode == 2 and "error: the media store s3://outputs/v is unreachable" in done.stderr, done.stderr
