"""Faults injected into real `omnistage serve` processes:

- the diffusion stage's `mp` child is killed (kill -9) under 4 concurrent requests: each finishes or fails
  cleanly (503, the stage named), nothing hangs, /health goes unhealthy and healthy again, and the same
  seeded request afterwards gives the same image as before the crash;
- SIGTERM with requests in flight: admission stops, the in-flight requests finish within the grace period,
  the process exits cleanly and leaves no child process;
- a video server killed (kill -9) with a job running, restarted on the same storage path: its jobs are
  listed, the finished one serves the same bytes, the interrupted one is run again from its stored request
  once its lease has expired (docs/fleet.md).
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from omnistage.testing.server import ServeProcess

pytestmark = pytest.mark.slow

LONG = {"prompt": "a red cat", "size": "64x64", "num_inference_steps": 150, "seed": 5}


def mp_children(pid: int) -> list[psutil.Process]:
    """The stage processes `mp` mode spawned (not multiprocessing's resource tracker)."""
    return [p for p in psutil.Process(pid).children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]


def wait_health(url: str, status: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{url}/health", timeout=10)
        if r.status_code == status:
            return r.json()
        assert time.monotonic() < deadline, f"/health stayed {r.status_code}: {r.text}"
        time.sleep(0.05)


def wait_in_flight(url: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/health", timeout=10).json()["in_flight"] < n:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def image(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/images/generations", json=body, timeout=120)


@pytest.fixture(scope="module")
def mp_server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("mp") / "server.log"
    server = ServeProcess.launch(
        [str(tiny_model("sd3")), "--stage-overrides", json.dumps({"0": {"process": "mp"}}), "--shutdown-timeout", "60"],
        log,
        ready_timeout=480,
    )
    yield server
    if server.proc.poll() is None:
        server.proc.kill()


def test_killed_stage_child_under_concurrent_requests(mp_server):
    url = mp_server.url
    before = image(url, {**LONG, "num_inference_steps": 4})
    assert before.status_code == 200
    [child] = mp_children(mp_server.proc.pid)
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(image, url, {**LONG, "seed": i}) for i in range(4)]
        wait_in_flight(url, 4)
        time.sleep(0.5)  # let the batch start denoising
        os.kill(child.pid, signal.SIGKILL)
        results = [f.result(timeout=120) for f in futures]  # (a hang fails here)
    for r in results:
        assert r.status_code in (200, 503), r.text
        if r.status_code == 503:
            err = r.json()["error"]
            assert err["code"] == "stage_unavailable" and "stage 0" in err["message"] and r.headers["Retry-After"]
    assert any(r.status_code == 503 for r in results)
    wait_health(url, 503, 10)  # the watcher saw it (a new stage process takes seconds to import and load)
    wait_health(url, 200, 300)
    [new_child] = mp_children(mp_server.proc.pid)
    assert new_child.pid != child.pid
    after = image(url, {**LONG, "num_inference_steps": 4})
    assert after.status_code == 200 and after.json()["data"] == before.json()["data"]


def test_sigterm_finishes_in_flight_requests_and_leaves_no_child(mp_server):
    url, proc = mp_server.url, mp_server.proc
    children = psutil.Process(proc.pid).children(recursive=True)
    assert mp_children(proc.pid)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(image, url, {**LONG, "seed": i}) for i in range(2)]
        wait_in_flight(url, 2)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.HTTPError):  # admission stopped: the listening socket is closed
            httpx.get(f"{url}/health", timeout=5).raise_for_status()
        results = [f.result(timeout=120) for f in futures]
    assert [r.status_code for r in results] == [200, 200]  # finished within the grace period
    assert proc.wait(120) in (0, -signal.SIGTERM)
    assert "omnistage.server: shutdown complete" in mp_server.log.read_text()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], alive


def test_video_jobs_survive_a_killed_server(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__PATH", str(tmp_path / "storage"))
    monkeypatch.setenv("OMNISTAGE_SERVER_JOB_LEASE_S", "2")  # the killed server's job is up for taking 2 s on
    args = [str(tiny_model("wan")), "--served-model-name", "tiny-wan"]
    first = ServeProcess.launch(args, tmp_path / "first.log", ready_timeout=480)
    try:
        c = httpx.Client(base_url=first.url, timeout=60)
        done = c.post(
            "/v1/videos",
            json={"prompt": "a cat", "size": "32x32", "num_frames": 5, "num_inference_steps": 2, "seed": 1},
        ).json()
        deadline = time.monotonic() + 120
        while c.get(f"/v1/videos/{done['id']}").json()["status"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        content = c.get(f"/v1/videos/{done['id']}/content").content
        running = c.post(
            "/v1/videos", json={"prompt": "a dog", "size": "64x64", "num_frames": 9, "num_inference_steps": 200}
        ).json()
        while c.get(f"/v1/videos/{running['id']}").json()["status"] != "in_progress":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        first.proc.kill()  # kill -9: no shutdown code runs
        first.proc.wait(30)
    second = ServeProcess.launch(args, tmp_path / "second.log", ready_timeout=480)
    try:
        c = httpx.Client(base_url=second.url, timeout=60)
        jobs = {j["id"]: j for j in c.get("/v1/videos").json()["data"]}
        assert jobs[done["id"]]["status"] == "completed"
        assert c.get(f"/v1/videos/{done['id']}/content").content == content
        assert jobs[running["id"]]["status"] in ("queued", "in_progress") and jobs[running["id"]]["error"] is None
        assert f"job {running['id']}: lease expired, taken over (attempt 1)" in second.log.read_text()
        assert c.delete(f"/v1/videos/{running['id']}").status_code == 200  # (200 steps: not waited for)
    finally:
        second.stop()
