"""`omnistage serve` of the tiny chat model while its vLLM engine core is killed (``kill -9``) mid-stream:
the streamed request ends with a clean 503-class error event, requests meanwhile get 503 + Retry-After
naming the stage, ``/health`` goes unhealthy and then healthy again, the next greedy request gives the
same text as before the crash, and SIGTERM afterwards leaves no child process behind."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import psutil
import pytest

from omnistage.testing.processes import engine_cores
from omnistage.testing.server import ServeProcess

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MESSAGES = [{"role": "user", "content": "hello there"}]


def greedy(url: str) -> str:
    r = httpx.post(
        f"{url}/v1/chat/completions", timeout=60, json={"messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def wait_health(url: str, status: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{url}/health", timeout=5)
        if r.status_code == status:
            return r.json()
        assert time.monotonic() < deadline, f"/health stayed {r.status_code}: {r.text}"
        time.sleep(0.1)


def test_killed_engine_core_fails_cleanly_and_the_stage_comes_back(tiny_model, tmp_path):
    log = tmp_path / "server.log"
    server = ServeProcess.launch([str(tiny_model("chat")), "--enforce-eager"], log, ready_timeout=480)
    url = server.url
    try:
        before = greedy(url)
        [core] = engine_cores(psutil.Process(server.proc.pid))
        body = {"messages": MESSAGES, "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}
        events: list[dict] = []
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            for line in lines:  # wait until tokens flow, then kill the engine core under the request
                if line.startswith("data: {") and json.loads(line[6:]).get("choices", [{}])[0].get("delta", {}).get(
                    "content"
                ):
                    break
            os.kill(core.pid, signal.SIGKILL)
            done = False
            for line in lines:  # (a stream that hung would end in httpx's 60 s read timeout)
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                elif line == "data: [DONE]":
                    done = True
                    break
            assert done, events[-3:]  # the stream was ended by the server, with its terminator
        errors = [e["error"] for e in events if "error" in e]
        assert len(errors) == 1 and errors[0]["code"] == "stage_unavailable", events[-3:]
        assert "stage 0" in errors[0]["message"] and "died" in errors[0]["message"]

        down = wait_health(url, 503, 10)  # the stream ended while the stage was down: at its death, not its rebuild
        assert down["status"] == "unavailable" and not down["stages"]["0"]["healthy"]
        assert "vLLM engine died" in down["stages"]["0"]["detail"]
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4}, timeout=30)
        if r.status_code != 200:  # unless the rebuild already finished: 503, retry later, the stage named
            assert r.status_code == 503 and r.headers["Retry-After"].isdigit(), r.text
            assert r.json()["error"]["code"] == "stage_unavailable" and "stage 0" in r.json()["error"]["message"]

        wait_health(url, 200, 300)
        [new_core] = engine_cores(psutil.Process(server.proc.pid))
        assert new_core.pid != core.pid
        assert greedy(url) == before
        assert "restarted (attempt 1 of 5)" in log.read_text()
        children = psutil.Process(server.proc.pid).children(recursive=True)
    except BaseException:
        server.proc.kill()
        print(log.read_text()[-6000:])  # the server's side of the failure
        raise
    server.stop()  # SIGTERM: a clean exit...
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], alive  # ...that leaves no child process (the new engine core included)
