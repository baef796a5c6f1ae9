"""Production behaviour: bounded admission (503 + Retry-After), client
disconnects abort the request in every stage, async video jobs can be
cancelled, and shutdown lets in-flight requests finish."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from omnistage.testing.server import serve_engine
from tests.server.conftest import error_of, new_engine
from tests.server.pipelines import GATE, WordEngine, omni_pipeline

BLOCKED_CHAT = {"messages": [{"role": "user", "content": "block: hi"}], "modalities": ["text"]}


@pytest.fixture(autouse=True)
def _gate():
    GATE.clear()
    yield
    GATE.set()  # never leave a stage thread waiting


def wait_for(cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def word_engines(srv) -> list[WordEngine]:
    return srv.engine.replicas(0)


def metric(srv, name: str) -> float:
    text = srv.client().get("/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory(new_engine(omni_pipeline()), max_pending=1, retry_after_s=3)


def test_saturated_server_answers_503_with_retry_after(srv):
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(lambda: srv.client().post("/v1/chat/completions", json=BLOCKED_CHAT))
        wait_for(lambda: srv.state.admission.pending == 1)
        r = srv.client().post("/v1/images/generations", json={"prompt": "x", "size": "8x8"})
        assert r.status_code == 503 and r.headers["retry-after"] == "3"
        assert error_of(r)["code"] == "server_saturated"
        assert metric(srv, "omnistage_requests_rejected_total") >= 1
        GATE.set()
        assert first.result().status_code == 200
    assert srv.client().post("/v1/images/generations", json={"prompt": "x", "size": "8x8"}).status_code == 200


def test_disconnect_aborts_nonstreaming_request(srv):
    aborted = metric(srv, "omnistage_requests_aborted_total")
    with ThreadPoolExecutor(1) as pool:

        def call():
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{srv.url}/v1/chat/completions", json=BLOCKED_CHAT, timeout=3)

        done = pool.submit(call)
        wait_for(lambda: word_engines(srv)[0]._running)  # the request is inside the stage
        done.result()
    # The stage saw the abort (its loop stopped) without the gate ever opening.
    wait_for(lambda: not srv.engine.running_requests() and not word_engines(srv)[0]._running)
    assert not GATE.is_set()
    assert metric(srv, "omnistage_requests_aborted_total") == aborted + 1
    assert srv.state.admission.pending == 0


def test_disconnect_aborts_streaming_request(srv):
    aborted = metric(srv, "omnistage_requests_aborted_total")
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        with c.stream("POST", "/v1/chat/completions", json={**BLOCKED_CHAT, "stream": True}) as r:
            lines = r.iter_lines()  # keep the iterator: dropping it closes the connection early
            first = next(lines)  # the response starts with the stage's first output
            assert first.startswith("data: ") and '"role":"assistant"' in first
            assert '"content":"echo"' in next(line for line in lines if line)
            wait_for(lambda: word_engines(srv)[0]._running)  # the request is inside the stage, blocked
        # leaving the block closes the connection mid-stream
    # The stage saw the abort (its loop ended) without the gate ever opening.
    wait_for(
        lambda: (
            not word_engines(srv)[0]._running and not srv.engine.running_requests() and srv.state.admission.pending == 0
        )
    )
    assert not GATE.is_set()
    assert metric(srv, "omnistage_requests_aborted_total") == aborted + 1
    assert srv.client().get("/health").status_code == 200


def test_video_job_in_progress_then_cancelled(srv):
    c = srv.client()
    job = c.post("/v1/videos", json={"prompt": "block: v", "num_frames": 2}).json()
    wait_for(
        lambda: (
            c.get(f"/v1/videos/{job['id']}").json()["status"] in ("queued", "in_progress")
            and srv.engine.running_requests()
        )
    )
    r = c.get(f"/v1/videos/{job['id']}/content")
    assert r.status_code == 409 and error_of(r)["code"] == "video_not_ready"
    assert c.delete(f"/v1/videos/{job['id']}").json() == {"id": job["id"], "object": "video.deleted", "deleted": True}
    wait_for(lambda: not srv.engine.running_requests() and srv.state.admission.pending == 0)
    assert c.get(f"/v1/videos/{job['id']}").status_code == 404


def _refuses_connections(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=0.2).close()
        return False
    except OSError:
        return True


def test_graceful_shutdown_finishes_in_flight_requests(tmp_path):
    from omnistage.config.settings import ServerSettings

    srv = serve_engine(new_engine(omni_pipeline()), ServerSettings(storage={"path": str(tmp_path)}))
    with ThreadPoolExecutor(1) as pool:
        inflight = pool.submit(lambda: httpx.post(f"{srv.url}/v1/chat/completions", json=BLOCKED_CHAT, timeout=60))
        wait_for(lambda: srv.state.admission.pending == 1)
        stopper = threading.Thread(target=srv.stop)
        stopper.start()
        wait_for(lambda: _refuses_connections(srv.url))  # shutdown has begun: no new connections
        GATE.set()
        r = inflight.result()
    stopper.join(30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "echo block: hi"
    assert not srv.thread.is_alive()
    assert not srv.engine.started  # the engine was shut down after the request finished
