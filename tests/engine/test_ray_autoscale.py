"""A Ray stage whose replicas follow the load (``replicas: {min, max, target_queue_per_replica}``) on a local
`ray start --head` cluster: a burst starts a second actor, new requests spread over both, and once the load
falls the newer one is drained while it still holds a request, which ends with the same answer as when run
alone. The policy and the drain in process: tests/engine/test_replica_scaling.py."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest

from omnistage import AsyncOmni
from omnistage.pipeline import Pipeline, StageSpec
from omnistage.server.metrics import ServerMetrics
from omnistage.testing import pipelines as tp
from omnistage.testing.streams import final_output
from tests.engine.test_ray_mode import ray_cluster  # noqa: F401 - the module's cluster fixture

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.asyncio(loop_scope="module")]
PIPELINE = Pipeline(
    "test_scaling_ray", [StageSpec(0, kind="llm", engine=tp.TokenStreamEngine, output="token_ids", final=True)]
)
SCALING = {"min": 1, "max": 2, "target_queue_per_replica": 2, "scale_down_delay_s": 1}
DEPLOY = {"distributed_executor_backend": "ray", "stages": [{"stage_id": 0, "replicas": SCALING}]}
SHORT = [{"max_tokens": 40, "extra_args": {"delay": 0.05}}]  # ~2 s each: the burst that asks for a second replica
LONG = [
    {"max_tokens": 120, "extra_args": {"delay": 0.05}}
]  # ~6 s: still running on the second replica when it is drained
DURING = [{"max_tokens": 10, "extra_args": {"delay": 0.05}}]  # sent while a replica drains: the other one takes it


async def _until(check, what: str, deadline_s: float = 90) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _tokens(out) -> list[int]:
    return list(out.token_ids)


async def _alone(engine: AsyncOmni, prompt: str, params: list[dict]) -> list[int]:
    """The request's tokens run alone; ``delay`` only paces the test engine's ticks, not what it makes."""
    paced = [{k: v for k, v in p.items() if k != "extra_args"} for p in params]
    return _tokens(await final_output(engine.generate(prompt, sampling_params_list=paced)))


async def test_a_burst_adds_a_replica_and_a_draining_one_loses_nothing(ray_cluster):  # noqa: F811
    prompts = [f"p{'x' * i}" for i in range(6)]
    async with AsyncOmni(pipeline=PIPELINE) as solo:  # each request alone, in process, without the pacing
        short = {p: await _alone(solo, p, SHORT) for p in prompts[:4]}
        long = {p: await _alone(solo, p, LONG) for p in prompts[4:]}
        during = await _alone(solo, prompts[0], DURING)
    async with AsyncOmni(pipeline=PIPELINE, deploy_config=DEPLOY) as engine:
        client = engine._orch.clients[0]
        metrics = ServerMetrics(engine.stage_stats)
        assert engine.stage_stats()[0].replicas == 1
        burst = [asyncio.create_task(final_output(engine.generate(p, sampling_params_list=SHORT))) for p in short]
        await _until(lambda: engine.stage_stats()[0].replicas == 2, "a second replica under the burst")
        assert engine.stage_stats()[0].scaled.startswith("up: ") and "want 2" in engine.stage_stats()[0].scaled
        # two more requests, one on each replica (turns alternate): load 2 once the burst ends, which asks for
        # one replica; the newer of two equally busy ones is drained, holding its long request
        tail = [asyncio.create_task(final_output(engine.generate(p, sampling_params_list=LONG))) for p in long]
        await _until(lambda: all(client.loads()) and sum(client.loads()) >= 2, "the tail on both replicas", 10)
        text = generate_latest(metrics.registry).decode()
        assert 'omnistage_stage_replicas{stage="0"} 2.0' in text and "omnistage_stage_last_scaling{" in text
        await _until(lambda: client.draining, "a replica drained")
        drained = client.draining[0]
        assert client.holding(drained) == 1 and "holding 1 request(s) to finish" in client.scaler.last_reason
        meanwhile = await final_output(engine.generate(prompts[0], sampling_params_list=DURING))  # to the other
        assert _tokens(meanwhile) == during and drained in client.replicas
        assert [_tokens(o) for o in await asyncio.gather(*burst)] == list(short.values())
        assert [_tokens(o) for o in await asyncio.gather(*tail)] == list(long.values())
        await _until(lambda: len(client.replicas) == 1, "the drained replica removed", 30)
        assert drained not in client.replicas and engine.stage_stats()[0].replicas == 1
        assert 'omnistage_stage_replicas{stage="0"} 1.0' in generate_latest(metrics.registry).decode()
        assert engine.is_ready
