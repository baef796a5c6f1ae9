"""Backpressure on each engine kind behind a real server: concurrency far above the stage's
``max_num_seqs`` queues (the excess is the stage's ``omnistage_stage_queue_depth`` on /metrics, its
batch never larger than the cap) and every request completes; with ``--max-pending`` the excess is a
503 + ``Retry-After`` at once, and the admitted ones still complete.

Engines: the generation engine (the test pipelines' image adapter) and the step-batched AR engine
(``stages/ar``, a counting tone model), where requests whose prompt starts with ``block:`` hold their
batch until ``GATE`` opens, so the queue can be read exactly (waiting + running == all of them); and,
marked slow, the diffusion engine (tiny SD3) and the llm engine (a tiny vLLM chat model), sampled while
they run.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from omnistage.pipeline import Pipeline, StageSpec
from omnistage.stages.ar.engine import ARRequest, Emit, StepEngine
from omnistage.stages.base import StageRequest
from tests.server.pipelines import GATE, SAMPLE_RATE, ImageAdapter

CAP = 2  # max_num_seqs of every stage here
N = 12  # concurrent requests: 6x the cap


class ToneSteps(StepEngine):
    """One 10 ms tone chunk per step, ``len(words)`` steps; a ``block:`` prompt's prefill waits for GATE."""

    def load_model(self):
        return object()

    def new_request(self, req: StageRequest) -> ARRequest:
        return ARRequest(req)

    def prefill_ready(self, r: ARRequest) -> bool:
        return True

    def _chunk(self, r: ARRequest) -> Emit:
        words = r.req.inputs["prompt"].split()
        t = torch.arange(SAMPLE_RATE // 100) / SAMPLE_RATE
        audio = 0.2 * torch.sin(2 * torch.pi * (200 + 50 * r.tokens) * t)
        return Emit(
            {"audio": audio, "sample_rate": SAMPLE_RATE},
            tokens=1,
            finish="stop" if r.tokens + 1 >= len(words) else None,
        )

    def prefill(self, r: ARRequest) -> Emit:
        if r.req.inputs["prompt"].startswith("block:"):
            GATE.wait(60)
        return self._chunk(r)

    def ready(self, r: ARRequest):
        return True

    def step(self, rs, items):
        return [self._chunk(r) for r in rs]


def _pipeline() -> Pipeline:
    return Pipeline(
        name="test_backpressure",
        stages=[
            StageSpec(0, kind="generation", adapter=ImageAdapter, output="image", final=True),
            StageSpec(1, kind="generation", engine=ToneSteps, output="audio", final=True),
        ],
    )


OVERRIDES = {"0": {"max_num_seqs": CAP}, "1": {"max_num_seqs": CAP}}


@pytest.fixture(autouse=True)
def _gate():
    GATE.clear()
    yield
    GATE.set()


@pytest.fixture(scope="module")
def srv(server_factory):
    from omnistage import AsyncOmni

    return server_factory(AsyncOmni(pipeline=_pipeline(), stage_overrides=OVERRIDES))


@pytest.fixture(scope="module")
def limited(server_factory):
    from omnistage import AsyncOmni

    return server_factory(
        AsyncOmni(pipeline=_pipeline(), stage_overrides=OVERRIDES), max_pending=CAP + 1, retry_after_s=4
    )


def stage_metric(srv, name: str, stage: int) -> float:
    text = httpx.get(f"{srv.url}/metrics", timeout=10).text
    line = next(ln for ln in text.splitlines() if ln.startswith(f'{name}{{stage="{stage}"}}'))
    return float(line.split()[-1])


def wait_for(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def image(srv, prompt: str) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/images/generations", json={"prompt": prompt, "size": "16x16"}, timeout=120)


def speech(srv, prompt: str) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/audio/speech", json={"input": prompt, "response_format": "pcm"}, timeout=120)


@pytest.mark.parametrize("call, stage", [(image, 0), (speech, 1)], ids=["generation", "ar_step"])
def test_far_above_the_cap_queues_on_metrics_and_completes(srv, call, stage):
    with ThreadPoolExecutor(N) as pool:
        futures = [pool.submit(call, srv, f"block: request number {i}") for i in range(N)]

        # the first batch holds (at most CAP), the rest wait in the stage's queue, as /metrics says: every
        # request is either running or counted as waiting
        def counted():
            depth = stage_metric(srv, "omnistage_stage_queue_depth", stage)
            running = stage_metric(srv, "omnistage_stage_running", stage)
            return running >= 1 and depth + running == N

        wait_for(counted)
        assert 1 <= stage_metric(srv, "omnistage_stage_running", stage) <= CAP
        assert httpx.get(f"{srv.url}/health", timeout=10).json()["in_flight"] == N
        GATE.set()
        results = [f.result(timeout=120) for f in futures]
    assert [r.status_code for r in results] == [200] * N, [r.text for r in results if r.status_code != 200]
    if stage == 1:  # every step batched at most CAP requests, and each request got all its chunks
        [engine] = srv.engine.replicas(1)
        assert max(engine.batch_sizes) <= CAP and max(engine.prefill_sizes) <= CAP
        assert all(len(r.content) == 2 * 4 * SAMPLE_RATE // 100 for r in results)  # 4 words, 10 ms each
    wait_for(lambda: stage_metric(srv, "omnistage_stage_queue_depth", stage) == 0)
    assert srv.state.admission.pending == 0


@pytest.mark.parametrize("call", [image, speech], ids=["generation", "ar_step"])
def test_max_pending_answers_503_at_once_and_the_admitted_complete(limited, call):
    with ThreadPoolExecutor(CAP + 1) as pool:
        admitted = [pool.submit(call, limited, f"block: admitted {i}") for i in range(CAP + 1)]
        wait_for(lambda: limited.state.admission.pending == CAP + 1)
        for _ in range(4):
            r = call(limited, "one more")
            assert r.status_code == 503 and r.headers["retry-after"] == "4"
            assert r.json()["error"]["code"] == "server_saturated"
            # refused at once, not after queueing: answered while the admitted ones still wait for GATE (a queued
            # request would wait behind them), and it never counted as pending
            assert not GATE.is_set() and not any(f.done() for f in admitted)
            assert limited.state.admission.pending == CAP + 1
        GATE.set()
        assert [f.result(timeout=120).status_code for f in admitted] == [200] * (CAP + 1)
    assert call(limited, "after the burst").status_code == 200


@pytest.mark.slow
def test_diffusion_engine_queues_far_above_its_rows(server_factory, tiny_model):
    """Tiny SD3 with room for CAP latent rows: N concurrent requests wait in the scheduler (seen on
    /metrics), the running batch never exceeds the rows, all complete."""
    from omnistage import AsyncOmni

    srv = server_factory(AsyncOmni(tiny_model("sd3"), stage_overrides={"0": {"max_num_seqs": CAP}}), ready_timeout=300)
    body = {"prompt": "a red cat", "size": "32x32", "num_inference_steps": 30, "guidance_scale": 1.0}
    depths, running = [], []
    with ThreadPoolExecutor(N) as pool:
        futures = [
            pool.submit(
                lambda i: httpx.post(f"{srv.url}/v1/images/generations", json={**body, "seed": i}, timeout=300), i
            )
            for i in range(N)
        ]
        while not all(f.done() for f in futures):
            depths.append(stage_metric(srv, "omnistage_stage_queue_depth", 0))
            running.append(stage_metric(srv, "omnistage_stage_running", 0))
            time.sleep(0.05)
        results = [f.result() for f in futures]
    assert [r.status_code for r in results] == [200] * N
    assert max(depths) >= N - 2 * CAP  # most of them waited
    assert max(running) <= CAP


@pytest.mark.slow
@pytest.mark.vllm
def test_llm_engine_queues_far_above_max_num_seqs(server_factory, tiny_model):
    """A tiny vLLM chat model with max_num_seqs=CAP: N concurrent streamed chats all complete (vLLM's own
    scheduler queues them; the stage's queue depth on /metrics shows the excess), the engine stays healthy."""
    from omnistage import AsyncOmni

    engine = AsyncOmni(
        tiny_model("chat"),
        max_model_len=512,
        dtype="float32",
        enforce_eager=True,
        stage_overrides={"0": {"max_num_seqs": CAP}},
    )
    srv = server_factory(engine, ready_timeout=300)
    body = {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }

    def chat(i: int) -> tuple[int, str]:
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json={**body, "seed": i}, timeout=300) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        return r.status_code, lines[-1] if lines else ""

    depths, running = [], []
    with ThreadPoolExecutor(N) as pool:
        futures = [pool.submit(chat, i) for i in range(N)]
        while not all(f.done() for f in futures):
            depths.append(stage_metric(srv, "omnistage_stage_queue_depth", 0))
            running.append(stage_metric(srv, "omnistage_stage_running", 0))
            time.sleep(0.02)
        results = [f.result() for f in futures]
    assert [(status, last) for status, last in results] == [(200, "data: [DONE]")] * N
    assert max(depths) >= N - 2 * CAP and max(running) <= CAP
    assert httpx.get(f"{srv.url}/health", timeout=10).json()["status"] == "ok"
