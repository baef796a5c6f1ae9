"""An llm stage in a Ray actor whose vLLM engine core is killed: the actor lives on, its engine rebuilds itself
(the same restart as in-process), the in-flight request fails with StageUnavailableError across the actor
boundary, the stage reports unhealthy meanwhile, and the next greedy request equals the one before."""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from omnistage import AsyncOmni, StageUnavailableError
from omnistage.testing.streams import final_output
from tests.engine.test_ray_mode import RAY, ray_cluster  # noqa: F401 (the module's local cluster fixture)

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.ray, pytest.mark.asyncio(loop_scope="module")]

GREEDY = [{"max_tokens": 12, "temperature": 0.0}]


async def wait(cond, timeout: float) -> None:
    for _ in range(int(timeout / 0.1)):
        if cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached")


async def test_engine_core_killed_inside_an_actor(ray_cluster, tiny_model):  # noqa: F811
    folder = str(tiny_model("chat"))
    async with AsyncOmni(folder, deploy_config=RAY, dtype="float32", max_model_len=512) as engine:
        before = (await final_output(engine.generate("hello there", sampling_params_list=GREEDY))).text
        replica = engine.replicas(0)[0]
        actor = psutil.Process(await replica.pid())
        cores: list[psutil.Process] = []

        def is_core(p: psutil.Process) -> bool:
            # vLLM retitles its core "VLLM::EngineCore" through setproctitle, which did not take in one CI run (both
            # of the actor's children still read `python -B -c ...`), so the actor's multiprocessing spawn child
            # counts too; its other child is multiprocessing's resource tracker.
            cmd = " ".join(p.cmdline())
            return "EngineCore" in p.name() + cmd or ("spawn_main" in cmd and "resource_tracker" not in cmd)

        def found_core() -> bool:
            cores[:] = [p for p in actor.children() if is_core(p)]
            return len(cores) == 1

        try:
            await wait(found_core, 30)
        except AssertionError:  # say what the actor's tree holds instead
            tree = [(p.pid, p.name(), p.cmdline()) for p in actor.children(recursive=True)]
            raise AssertionError(f"no single EngineCore under actor {actor.pid} ({actor.name()}): {tree}") from None
        # kill the engine core while a long request is in flight: once its first tokens have streamed
        long = [{"max_tokens": 480, "temperature": 0.0, "ignore_eos": True}]
        with pytest.raises(StageUnavailableError, match="vLLM engine died"):
            async for out in engine.generate("hello there", sampling_params_list=long):
                if out.delta.get("text") and cores:
                    os.kill(cores.pop().pid, signal.SIGKILL)
        await wait(lambda: not engine.is_ready, 10)
        assert "vLLM engine died" in engine.stage_stats()[0].detail
        await wait(lambda: engine.is_ready, 300)
        assert replica.restarts == 0 and await replica.pid() == actor.pid  # the actor itself never died
        after = (await final_output(engine.generate("hello there", sampling_params_list=GREEDY))).text
        assert after == before
