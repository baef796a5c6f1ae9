"""--request-timeout: a request still running after it is aborted in every stage and answered 504 (an SSE
error event once a stream has started; a failed job for async videos); its admission slot is freed."""

from __future__ import annotations

import json
import time

import pytest

from tests.server.conftest import error_of, new_engine
from tests.server.pipelines import GATE, omni_pipeline

BLOCKED = {"messages": [{"role": "user", "content": "block: hi"}], "modalities": ["text"]}


@pytest.fixture(autouse=True)
def _gate():
    GATE.clear()
    yield
    GATE.set()


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory(new_engine(omni_pipeline()), request_timeout_s=0.5, max_pending=2)


def idle(srv) -> bool:
    return srv.state.admission.pending == 0 and srv.engine.running_requests() == []


def wait_for(cond, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_a_request_past_the_timeout_is_aborted_with_504(srv):
    r = srv.client().post("/v1/chat/completions", json=BLOCKED)
    assert r.status_code == 504, r.text
    err = error_of(r)
    assert err["code"] == "request_timeout" and "0.5" in err["message"]
    wait_for(lambda: idle(srv))  # aborted in the stage, slot released
    ok = srv.client().post("/v1/chat/completions", json={**BLOCKED, "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200  # a quick request is untouched


def test_a_stream_past_the_timeout_ends_with_an_error_event(srv):
    with srv.client().stream("POST", "/v1/chat/completions", json={**BLOCKED, "stream": True}) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    wait_for(lambda: idle(srv))


def test_a_video_job_past_the_timeout_fails(srv):
    c = srv.client()
    job = c.post("/v1/videos", json={"prompt": "block: a cat", "size": "16x16"}).json()
    wait_for(lambda: c.get(f"/v1/videos/{job['id']}").json()["status"] == "failed")
    assert c.get(f"/v1/videos/{job['id']}").json()["error"]["code"] == "request_timeout"
    GATE.set()  # the test stage's worker thread waits on the gate even after the abort
    wait_for(lambda: idle(srv))
