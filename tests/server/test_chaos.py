"""The short chaos run (``benchmarks/chaos.py`` is the long one, same harness: ``omnistage.testing.chaos``):
one ``omnistage serve`` of tiny CSM with its AR step engine in an ``mp`` process, SSE-streamed, raw-streamed,
whole and abandoned speech plus bad requests from client threads, and that process killed (``kill -9``)
twice under the load. Every request must end within the deadline as the invariants allow (200 / 503
``stage_unavailable`` + ``Retry-After`` / one SSE error event / a raw stream complete or visibly broken off /
its 4xx), the server healthy again with a new process each time, the greedy speech equal to before, nothing
left in flight, and no process of the tree left after SIGTERM."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from omnistage.testing import chaos as ch
from omnistage.testing import processes as pr
from omnistage.testing.server import ServeProcess

pytestmark = pytest.mark.slow

BODY = {"input": "hello there friend", "response_format": "pcm", "temperature": 0, "max_tokens": 24}
BAD = [
    ("/v1/audio/speech", {"json": {"input": "hi", "voice": "7"}}, 400),
    ("/v1/audio/speech", {"json": {"input": ""}}, 400),
    ("/v1/audio/speech", {"content": b"{oops", "headers": {"content-type": "application/json"}}, 400),
]


def wait_for_ok(load: ch.Load, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not any(o.result == "ok" for o in load.outcomes):
        assert time.monotonic() < end, f"no request of the load ended 200 within {timeout} s"
        time.sleep(0.1)


def test_ar_step_process_killed_twice_under_mixed_load(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__PATH", str(tmp_path / "storage"))
    server = ServeProcess.launch(
        [
            str(tiny_model("csm")),
            "--served-model-name",
            "csm",
            "--stage-overrides",
            json.dumps({"0": {"process": "mp"}}),
        ],
        tmp_path / "server.log",
    )
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            before = c.post("/v1/audio/speech", json=BODY)
        assert before.status_code == 200 and before.content
        expected = np.frombuffer(before.content, dtype="<i2").astype(np.int32)

        def same_speech(r: httpx.Response) -> bool:
            """The same codes as alone; the codec decodes a batch within 1e-4, so 16-bit samples within 4."""
            got = np.frombuffer(r.content, dtype="<i2").astype(np.int32)
            return got.shape == expected.shape and int(np.abs(got - expected).max()) <= 4

        load = ch.Load(
            "csm",
            server.url,
            [
                ("speech_sse", ch.speech_sse(BODY)),
                ("speech_raw", ch.speech_raw(BODY, len(before.content))),
                ("speech_whole", ch.post_json("/v1/audio/speech", BODY, same_speech, seed=False)),
                ("abandoned", ch.abandon("/v1/audio/speech", {**BODY, "stream_format": "sse"})),
                ("bad", ch.bad(BAD)),
            ],
            threads=3,
        ).start()
        try:
            wait_for_ok(load)  # on a loaded machine the first kill could otherwise land before any request ended
            kills = [
                ch.kill_and_recover("csm", server.url, server.proc.pid, "ar_step_process", pr.stage_children)
                for _ in range(2)
            ]
        finally:
            load.stop()
        summary = ch.summary(load.outcomes)
        assert summary["violations"] == [], summary["violations"][:5]
        for k in kills:  # unhealthy after the kill, then healthy with a new process (error: not within the deadline)
            assert k.error is None and k.saw_unhealthy and k.replaced, k  # (recovery times: benchmarks/chaos.py)
        results = {o.result for o in load.outcomes}
        assert {"ok", "rejected"} <= results  # the load really ran ...
        assert results & {"unavailable", "error_event", "broken_off"}  # ... and really met the dead stage
        with httpx.Client(base_url=server.url, timeout=60) as c:
            assert c.post("/v1/audio/speech", json=BODY).content == before.content  # same greedy speech after
        assert ch.health(server.url)[1]["in_flight"] == 0
        procs = pr.tree(server.proc.pid)
    except BaseException:
        server.proc.kill()
        print(server.log.read_text()[-6000:])
        raise
    server.stop()
    assert pr.left_after(procs) == []
