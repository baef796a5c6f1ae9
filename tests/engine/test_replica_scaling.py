"""Replicas that follow the load, in process: the policy alone, the deploy fields, a replica drained while it
holds a request, and the scaler's up and down steps over real (test) stage engines. The same on Ray actors:
tests/engine/test_ray_autoscale.py."""

from __future__ import annotations

import asyncio

import pytest

from omnistage.config import ConfigError, load_deploy_config
from omnistage.config.schema import StageDeployConfig
from omnistage.config.stage_sections import ReplicaScalingConfig
from omnistage.engine.replica_scaler import ReplicaScaler
from omnistage.engine.scaling_policy import decide
from omnistage.engine.stage_client import StageClient
from omnistage.pipeline import StageContext, StageSpec
from omnistage.stages.base import StageRequest
from omnistage.testing import pipelines as tp

LIMITS = ReplicaScalingConfig(min=1, max=3, target_queue_per_replica=2, scale_down_delay_s=5)
SPEC = StageSpec(0, kind="llm", engine=tp.TokenStreamEngine, output="token_ids", final=True)


@pytest.mark.parametrize(
    ("queues", "current", "replicas", "words"),
    [
        ([0], 1, 1, "steady: 0 request(s) in flight at 2 per replica"),
        ([2], 1, 1, "steady: 2 request(s)"),
        ([3], 1, 2, "up: 3 request(s) in flight at 2 per replica want 2"),
        ([4, 4], 2, 3, "want 4 (capped at max)"),
        ([1, 0, 0], 3, 1, "down: 1 request(s) in flight at 2 per replica want 1"),
        ([0, 0], 2, 1, "want 0 (kept at min)"),
        ([2, 2], 2, 2, "steady: 4 request(s)"),  # exactly at target: no third replica
    ],
)
def test_the_policy_wants_the_load_over_the_target_within_the_limits(queues, current, replicas, words):
    decision = decide(queues, current, LIMITS)
    assert decision.replicas == replicas and words in decision.reason


def test_a_fractional_target_rounds_up():
    limits = ReplicaScalingConfig(min=1, max=8, target_queue_per_replica=0.5)
    assert decide([3], 1, limits).replicas == 6 and decide([1, 1], 2, limits).replicas == 4


def _deploy(stage: dict, backend: str = "ray"):
    return load_deploy_config({"distributed_executor_backend": backend, "stages": [{"stage_id": 0, **stage}]})


def test_the_deploy_key_is_replicas_and_a_stage_starts_at_min():
    sd = _deploy({"replicas": {"min": 2, "max": 4, "target_queue_per_replica": 3}}).stage(0)
    assert sd.autoscale == ReplicaScalingConfig(min=2, max=4, target_queue_per_replica=3)
    assert sd.replicas == 2 and sd.replica_devices() == [None, None]


@pytest.mark.parametrize(
    ("stage", "backend", "message"),
    [
        ({"replicas": {"min": 3, "max": 2}}, "ray", "max (2) is below min (3)"),
        ({"replicas": {"max": 2, "target_queue_per_replica": 0}}, "ray", "replicas.target_queue_per_replica"),
        ({"replicas": {"max": 2}, "num_replicas": 2}, "ray", "num_replicas (a fixed count) or replicas"),
        ({"replicas": {"max": 2}, "devices": "0,1"}, "ray", "takes no devices list"),
        ({"replicas": {"max": 2, "step": 1}}, "ray", "replicas.step"),
        ({"replicas": {"max": 2}}, "mp", "replicas (min/max) applies to Ray stages only"),
    ],
)
def test_bad_replica_limits_name_the_field(stage, backend, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _deploy(stage, backend)


def test_a_higher_layer_swaps_a_fixed_count_and_a_scaling_one():
    base = {"distributed_executor_backend": "ray", "stages": [{"stage_id": 0, "replicas": {"max": 4}}]}
    fixed = load_deploy_config(base, {"0": {"num_replicas": 3}}).stage(0)
    assert fixed.autoscale is None and fixed.replicas == 3
    back = {"distributed_executor_backend": "ray", "stages": [{"stage_id": 0, "runtime": {"num_replicas": 3}}]}
    scaling = load_deploy_config(back, {"0": {"replicas": {"max": 4}}}).stage(0)
    assert scaling.autoscale.max == 4 and scaling.replicas == 1


def _engine(replica: int = 0) -> tp.TokenStreamEngine:
    return tp.TokenStreamEngine(
        StageContext(spec=SPEC, deploy=StageDeployConfig(stage_id=0), model=None, replica=replica)
    )


async def _tokens(client: StageClient, request_id: str, prompt: str = "abc", n: int = 5) -> list[int]:
    out: list[int] = []
    async for o in client.generate(StageRequest(request_id, {"prompt": prompt}, {"max_tokens": n})):
        out += o.data.get("token_ids", [])
    return out


@pytest.mark.asyncio
async def test_a_draining_replica_finishes_what_it_holds_and_takes_nothing_new():
    solo = _engine().reference(3, 5)  # "abc": the first token follows token len("abc") % 64
    first, second = _engine(0), _engine(1)
    client = StageClient(SPEC, [first, second])
    tp.HOLD["held"] = asyncio.Event()
    try:
        await _tokens(client, "warm")  # replica 0 in turn; the next request goes to replica 1
        held = asyncio.create_task(_tokens(client, "held"))
        while not client.holding(second):
            await asyncio.sleep(0.01)
        drain = asyncio.create_task(client.drain(second))
        await asyncio.sleep(0.05)
        assert client.serving() == [first] and not drain.done()
        assert client.stats().replicas == 1
        for i in range(3):  # every new request goes to the replica that is not draining
            assert await _tokens(client, f"new{i}") == solo
            assert second.stats().running == 1  # still only the held one
        with pytest.raises(ValueError, match="last serving replica"):
            await client.drain(first)
        tp.HOLD["held"].set()
        assert await asyncio.wait_for(held, 10) == solo
        await asyncio.wait_for(drain, 10)
        assert client.replicas == [first] and client.draining == []
    finally:
        tp.HOLD.pop("held", None)


@pytest.mark.asyncio
async def test_the_scaler_adds_under_load_and_drains_only_after_the_delay():
    client = StageClient(SPEC, [_engine(0)])
    started: list[int] = []

    async def start_replica(idx: int):
        started.append(idx)
        return _engine(idx)

    scaler = ReplicaScaler(client, start_replica, LIMITS)
    client.scaler = scaler
    held = [f"h{i}" for i in range(5)]
    for rid in held:
        tp.HOLD[rid] = asyncio.Event()
    try:
        tasks = [asyncio.create_task(_tokens(client, rid)) for rid in held]
        while sum(client.loads()) < 5:
            await asyncio.sleep(0.01)
        scaler.step(now=0.0)  # 5 in flight at 2 per replica: 3
        await scaler._starting
        assert started == [1, 2] and len(client.serving()) == 3
        assert client.stats().scaled == "up: 5 request(s) in flight at 2 per replica want 3; now 3"
        for rid in held:
            tp.HOLD[rid].set()
        await asyncio.gather(*tasks)
        scaler.step(now=10.0)  # idle: 1 wanted, but not for the delay yet
        scaler.step(now=14.9)
        assert len(client.serving()) == 3
        scaler.step(now=15.0)
        assert len(client.serving()) == 1 and "down: 0 request(s)" in scaler.last_reason
        await asyncio.wait_for(asyncio.gather(*scaler._drains), 10)
        assert len(client.replicas) == 1 and client.replicas[0] is not None
    finally:
        for rid in held:
            tp.HOLD.pop(rid, None)
        await client.shutdown()
