"""Video jobs survive a restart on the same storage path: the new server lists them, serves the finished
ones' content byte for byte, runs again the one the old process handed back when it stopped, reports the
ones a process that died was running as failed with a reason, and the TTL sweeper still deletes expired files together with their job records."""

from __future__ import annotations

import threading
import time

import pytest

from omnistage.config.settings import ServerSettings
from omnistage.server.jobstore.sqlite_store import SqliteJobStore as JobStore
from omnistage.testing.server import serve_engine
from tests.server.conftest import new_engine
from tests.server.pipelines import GATE, omni_pipeline


@pytest.fixture(autouse=True)
def _gate():
    GATE.clear()
    yield
    GATE.set()


def server(path, **storage):
    settings = ServerSettings(storage={"path": str(path), **storage})
    return serve_engine(new_engine(omni_pipeline()), settings, served_model_name="omni", shutdown_grace_s=0.5)


def wait_until(cond, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def wait_status(client, job_id: str, statuses: set[str], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/v1/videos/{job_id}").json()
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.05)


async def test_job_store_round_trip_and_reopen(tmp_path):
    store = JobStore(tmp_path)
    await store.open()
    await store.put("video", "video_a", "completed", 5, {"id": "video_a", "n": 1}, "video_a.mp4")
    await store.put("video", "video_b", "queued", 3, {"id": "video_b"})
    await store.put("voice", "voice_x", "ready", 1, {"id": "voice_x"})  # another kind shares the table
    await store.put("video", "video_b", "failed", 3, {"id": "video_b", "error": "x"})  # replaced, not added
    await store.close()
    store = JobStore(tmp_path)
    await store.open()
    assert await store.load("video") == [{"id": "video_b", "error": "x"}, {"id": "video_a", "n": 1}]
    await store.delete("video_b")
    assert await store.load("video") == [{"id": "video_a", "n": 1}]
    assert await store.load("voice") == [{"id": "voice_x"}]
    await store.close()


def test_jobs_and_contents_survive_a_restart(tmp_path):
    with server(tmp_path) as first:
        c = first.client()
        done = c.post("/v1/videos", json={"prompt": "a cat", "size": "16x16", "num_frames": 3, "seed": 1}).json()
        wait_status(c, done["id"], {"completed"})
        content = c.get(f"/v1/videos/{done['id']}/content").content
        running = c.post("/v1/videos", json={"prompt": "block: a dog", "size": "16x16"}).json()
        wait_until(lambda: running["id"] in first.engine.running_requests())
        # stop the old server with the second job still running (shutdown grace 0.5 s: it is handed back to the
        # job store, queued, rather than failed)
        stopping = threading.Thread(target=first.stop)
        stopping.start()
        wait_until(lambda: running["id"] not in first.state.videos)  # its end is recorded
        GATE.set()  # free the stage's worker thread, so the engine can shut down
        stopping.join()
    with server(tmp_path) as second:
        c = second.client()
        listed = {j["id"]: j for j in c.get("/v1/videos", params={"order": "asc"}).json()["data"]}
        assert set(listed) == {done["id"], running["id"]}
        assert listed[done["id"]]["status"] == "completed" and listed[done["id"]]["prompt"] == "a cat"
        assert c.get(f"/v1/videos/{done['id']}/content").content == content
        assert listed[running["id"]]["status"] in ("queued", "in_progress", "completed")  # never failed
        rerun = wait_status(c, running["id"], {"completed", "failed"})  # taken at start-up, run from its request
        assert rerun["status"] == "completed" and rerun["error"] is None, rerun
        assert c.delete(f"/v1/videos/{done['id']}").json()["deleted"]
    with server(tmp_path) as third:  # a deleted job stays deleted
        assert [j["id"] for j in third.client().get("/v1/videos").json()["data"]] == [running["id"]]


async def test_a_job_running_when_the_process_died_is_failed_with_the_reason(tmp_path):
    """What a killed process leaves behind: a row still ``in_progress`` (the e2e test kills a real one)."""
    store = JobStore(tmp_path)
    await store.open()
    record = {
        "id": "video_" + "a" * 32,
        "object": "video",
        "model": "omni",
        "prompt": "p",
        "status": "in_progress",
        "progress": 40,
        "created_at": 1,
    }
    other = {**record, "id": "video_" + "b" * 32, "model": "another-model"}  # another server's job: left alone
    await store.put("video", record["id"], "in_progress", 1, record)
    await store.put("video", other["id"], "in_progress", 1, other)
    await store.close()
    with server(tmp_path) as srv:
        job = srv.client().get(f"/v1/videos/{record['id']}").json()
        assert job["status"] == "failed" and job["error"]["code"] == "server_restarted"
        assert srv.client().get(f"/v1/videos/{other['id']}").status_code == 404
    store = JobStore(tmp_path)
    await store.open()
    rows = {r["id"]: r for r in await store.load("video")}
    assert rows[record["id"]]["status"] == "failed" and rows[other["id"]]["status"] == "in_progress"
    await store.close()


async def test_ttl_sweeper_deletes_expired_jobs_with_their_files(tmp_path):
    with server(tmp_path, file_ttl=1, ttl_sweep_interval=1) as srv:
        c = srv.client()
        job = c.post("/v1/videos", json={"prompt": "a cat", "size": "16x16", "num_frames": 3}).json()
        assert wait_status(c, job["id"], {"completed"})["expires_at"] is not None
        wait_until(lambda: c.get(f"/v1/videos/{job['id']}").status_code == 404)
        assert not (tmp_path / f"{job['id']}.mp4").exists()
    store = JobStore(tmp_path)
    await store.open()
    assert await store.load("video") == []
    await store.close()
