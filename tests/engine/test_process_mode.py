"""Stages in child processes (process: mp): same results, clean failure modes."""

import asyncio
import multiprocessing as mp
import os
import signal

import pytest
import torch

from omnistage import AsyncOmni, StageFailedError
from omnistage.config import ConfigError
from omnistage.pipeline import Edge, Pipeline, StageSpec
from omnistage.testing import pipelines as tp
from omnistage.testing.streams import final_output


def _children() -> list:
    return [p for p in mp.active_children() if p.name.startswith("omnistage-stage")]


async def test_mp_stages_give_identical_results_to_inline():
    prompts = ["one", "two two", "three three three"]
    async with AsyncOmni(pipeline=tp.chain()) as inline:
        expected = [(await final_output(inline.generate(p))).latents for p in prompts]
    async with AsyncOmni(pipeline=tp.chain(process="mp")) as engine:
        assert len(_children()) == 2  # stages 0 and 1 in their own processes, stage 2 inline
        got = [await final_output(engine.generate(p)) for p in prompts]  # one at a time: same batch sizes as inline
        for e, g in zip(expected, got):
            assert torch.equal(e, g.latents)
        together = await asyncio.gather(*(final_output(engine.generate(p)) for p in prompts))
        for e, g in zip(expected, together):  # batched: only floating-point batch variance
            torch.testing.assert_close(g.latents, e, rtol=0, atol=1e-5)
        # A request the child rejects comes back as an error for that request only.
        with pytest.raises(StageFailedError, match="boom"):
            await final_output(engine.generate("boom"))
        assert engine.is_ready
    assert _children() == []


async def test_dying_child_fails_in_flight_requests_and_is_restarted():
    p = Pipeline(
        "test_slow_mp",
        [
            StageSpec(
                0,
                kind="llm",
                engine=tp.TokenStreamEngine,
                output="token_ids",
                final=True,
                deploy_defaults={"process": "mp"},
            ),
        ],
    )
    async with AsyncOmni(pipeline=p) as engine:
        slow = [{"max_tokens": 1000, "extra_args": {"delay": 0.01}}]
        task = asyncio.create_task(final_output(engine.generate("x", sampling_params_list=slow)))
        await asyncio.sleep(0.5)
        child = _children()[0]
        os.kill(child.pid, signal.SIGKILL)
        with pytest.raises(StageFailedError, match="process died"):
            await asyncio.wait_for(task, 10)
        replica = engine.replicas(0)[0]
        assert replica.restarts == 1
        for _ in range(600):  # the replacement process comes up and serves again
            if engine.is_ready:
                break
            await asyncio.sleep(0.1)
        assert engine.is_ready and _children()[0].pid != child.pid
        out = await final_output(engine.generate("x", sampling_params_list=[{"max_tokens": 3}]))
        assert out.finished and len(out.token_ids) == 3


async def test_a_request_sent_to_a_child_that_just_died_ends_before_the_watcher_sees_it(monkeypatch):
    """The chaos run's one hang: a request submitted in the moment between the child's death and the watcher
    noticing it blocked forever in the send (a PUSH with no peer waits for one). The watcher is made slow here
    so that moment lasts; the request must still end at once as a retryable 503."""
    from omnistage.errors import StageUnavailableError
    from omnistage.transport import process

    monkeypatch.setattr(process, "WATCH_INTERVAL_S", 30.0)
    async with AsyncOmni(pipeline=tp.chain(process="mp")) as engine:
        await final_output(engine.generate("warm"))
        os.kill(_children()[0].pid, signal.SIGKILL)
        await asyncio.sleep(0.5)  # dead, and its socket gone; the watcher sleeps on
        with pytest.raises(StageUnavailableError, match="process died"):
            await asyncio.wait_for(final_output(engine.generate("after")), 10)


async def test_start_failure_shuts_down_started_stages():
    p = Pipeline(
        "test_bad_start",
        [
            StageSpec(
                0, kind="generation", adapter=tp.TextEmbedAdapter, output="latent", deploy_defaults={"process": "mp"}
            ),
            StageSpec(
                1,
                kind="generation",
                adapter=tp.FailingStartAdapter,
                output="latent",
                final=True,
                inputs=[Edge(0)],
                deploy_defaults={"process": "mp"},
            ),
        ],
    )
    engine = AsyncOmni(pipeline=p)
    with pytest.raises(RuntimeError, match="weights are corrupt"):
        await engine.start()
    await asyncio.sleep(0.1)
    assert _children() == []  # stage 0's process was shut down: no orphans


def test_invalid_output_type_fails_before_anything_starts():
    with pytest.raises(ConfigError, match="invalid output type 'latents'"):
        AsyncOmni(
            pipeline=tp.chain(process="mp"),
            deploy_config={"stages": [{"stage_id": 1, "engine_output_type": "latents"}]},
        )
    with pytest.raises(ConfigError, match="cannot produce audio"):
        AsyncOmni(
            pipeline=tp.chain(process="mp"), deploy_config={"stages": [{"stage_id": 1, "engine_output_type": "audio"}]}
        )
    with pytest.raises(ConfigError, match="devices"):
        AsyncOmni(
            pipeline=tp.chain(process="mp"),
            deploy_config={"stages": [{"stage_id": 0, "devices": "0,1", "num_replicas": 1}]},
        )
    assert _children() == []


async def test_replicas_round_robin_with_affinity():
    async with AsyncOmni(pipeline=tp.chain(), stage_overrides={"1": {"num_replicas": 2}}) as engine:
        replicas = engine.replicas(1)
        assert len(replicas) == 2
        outs = await asyncio.gather(*(final_output(engine.generate(f"p{i}")) for i in range(4)))
        assert all(o.finished for o in outs)
        used = [r.adapter.batch_sizes for r in replicas]
        assert all(used), "both replicas served requests"


async def test_shared_memory_connector_gives_identical_results():
    shm = {
        "connectors": {"shm": {"name": "SharedMemoryConnector", "extra": {"threshold_bytes": 8}}},
        "stages": [{"stage_id": 0, "connector": "shm"}, {"stage_id": 1, "connector": "shm"}],
    }
    async with AsyncOmni(pipeline=tp.chain()) as inline:
        expected = (await final_output(inline.generate("shared memory"))).latents
    async with AsyncOmni(pipeline=tp.chain(process="mp"), deploy_config=shm) as engine:
        assert engine.replicas(0)[0].ctx.shm_threshold == 8
        assert torch.equal((await final_output(engine.generate("shared memory"))).latents, expected)
    with pytest.raises(ConfigError, match="unknown connector 'Nope'"):
        AsyncOmni(pipeline=tp.chain(), deploy_config={"connectors": {"x": {"name": "Nope"}}})
