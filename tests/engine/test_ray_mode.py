"""Stages as Ray actors (distributed_executor_backend: ray) on a local `ray start --head` cluster:
same results as in-process, streaming edges, bad input, actor death and restart."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import filelock
import numpy as np
import pytest
import torch

from omnistage import AsyncOmni, InvalidRequestError, StageFailedError
from omnistage.pipeline import Pipeline, StageSpec
from omnistage.testing import pipelines as tp
from omnistage.testing.processes import ray_stage_actors
from omnistage.testing.server import free_port
from omnistage.testing.streams import final_output
from tests.stages.diffusion.helpers import reference_pipeline

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.asyncio(loop_scope="module")]
RAY = {"distributed_executor_backend": "ray"}


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A real single-node cluster, as `ray start --head` makes it; the test process joins as a driver."""
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    port = free_port()
    # no token auth: a head started here would otherwise pick up a stale ~/.ray/auth_token that this
    # driver does not send
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    # one cluster on the machine at a time: `ray stop --force` below ends every Ray process here, so a module in
    # another test worker (make test runs two) must not have its cluster running then
    lock = filelock.FileLock(Path(tempfile.gettempdir()) / "omnistage-tests-ray-cluster.lock")
    lock.acquire()
    try:
        subprocess.run(
            [
                ray_bin,
                "start",
                "--head",
                f"--port={port}",
                "--num-cpus=2",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={tmp_path_factory.mktemp('ray')}",
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        yield os.environ["RAY_ADDRESS"]
    finally:
        import ray

        ray.shutdown()
        os.environ.pop("RAY_ADDRESS", None)
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True)
        lock.release()


async def test_ray_stages_give_identical_results_to_inline(ray_cluster):
    prompts = ["one", "two two", "three three three"]
    async with AsyncOmni(pipeline=tp.chain()) as inline:
        expected = [(await final_output(inline.generate(p))).latents for p in prompts]
    async with AsyncOmni(pipeline=tp.chain(), deploy_config=RAY) as engine:
        replicas = [engine.replicas(sid)[0] for sid in range(3)]
        assert {type(r).__name__ for r in replicas} == {"RayStageEngine"}
        pids = {await r.pid() for r in replicas}
        assert os.getpid() not in pids and len(pids) == 3  # three actors, none of them this process
        for p, e in zip(prompts, expected):
            assert torch.equal((await final_output(engine.generate(p))).latents, e)
        with pytest.raises(StageFailedError, match="boom"):  # a stage fault fails that request only
            await final_output(engine.generate("boom"))
        assert engine.is_ready


async def test_streaming_edge_and_bad_input_across_actors(ray_cluster):
    async with AsyncOmni(pipeline=tp.streaming()) as inline:
        expected = await final_output(inline.generate("a b c d e", sampling_params_list=[{"max_tokens": 7}, {}]))
    async with AsyncOmni(pipeline=tp.streaming(), deploy_config=RAY) as engine:
        got = await final_output(engine.generate("a b c d e", sampling_params_list=[{"max_tokens": 7}, {}]))
        assert torch.equal(got.latents, expected.latents)
        with pytest.raises(InvalidRequestError, match="max_tokens"):
            await final_output(engine.generate("x", sampling_params_list=[{"max_tokens": -1}, {}]))
        assert (await final_output(engine.generate("x", sampling_params_list=[{"max_tokens": 2}, {}]))).finished


async def test_dying_actor_fails_in_flight_requests_and_is_restarted(ray_cluster):
    p = Pipeline(
        "test_slow_ray", [StageSpec(0, kind="llm", engine=tp.TokenStreamEngine, output="token_ids", final=True)]
    )
    async with AsyncOmni(pipeline=p, deploy_config=RAY) as engine:
        replica = engine.replicas(0)[0]
        old = await replica.pid()
        slow = [{"max_tokens": 1000, "extra_args": {"delay": 0.01}}]
        task = asyncio.create_task(final_output(engine.generate("x", sampling_params_list=slow)))
        await asyncio.sleep(0.5)
        os.kill(old, signal.SIGKILL)
        with pytest.raises(StageFailedError, match="Ray actor died"):
            await asyncio.wait_for(task, 30)
        for _ in range(600):  # the replacement actor comes up and serves again
            if engine.is_ready:
                break
            await asyncio.sleep(0.1)
        assert engine.is_ready and replica.restarts == 1 and await replica.pid() != old
        out = await final_output(engine.generate("x", sampling_params_list=[{"max_tokens": 3}]))
        assert out.finished and len(out.token_ids) == 3


async def test_a_stop_while_an_actor_is_replaced_leaves_no_actor(ray_cluster):
    """The stage stops (what SIGTERM does to a server) while its dead actor's replacement is still starting
    (its engine takes seconds): the replacement ends too, no ``ray::StageActor`` process stays."""
    p = Pipeline(
        "test_slow_start_ray", [StageSpec(0, kind="llm", engine=tp.SlowStartEngine, output="token_ids", final=True)]
    )
    engine = await AsyncOmni(pipeline=p, deploy_config=RAY).start()
    try:
        old = await engine.replicas(0)[0].pid()
        os.kill(old, signal.SIGKILL)
        async with asyncio.timeout(120):  # a deadline that stops a hang
            while not [a for a in ray_stage_actors() if a.pid != old]:
                await asyncio.sleep(0.1)
        assert not engine.is_ready  # the replacement is still starting
    finally:
        await asyncio.wait_for(engine.shutdown(), 60)
    async with asyncio.timeout(30):  # a deadline: the replacement, left to Ray, was still there after it
        while ray_stage_actors():
            await asyncio.sleep(0.2)


async def test_diffusion_family_on_ray_equals_diffusers(ray_cluster, tiny_model):
    """A real family (tiny SD3) in an actor: the image still equals diffusers' own pipeline."""
    folder = str(tiny_model("sd3"))
    kw = dict(num_inference_steps=3, guidance_scale=4.0, height=32, width=32)
    async with AsyncOmni(folder, deploy_config=RAY) as engine:
        out = await final_output(engine.generate("a red cat", sampling_params_list=[dict(seed=3, **kw)]))
    ref = reference_pipeline("StableDiffusion3Pipeline", folder)
    expected = ref("a red cat", generator=torch.Generator().manual_seed(3), **kw).images[0]
    assert np.array_equal(np.asarray(out.images[0]), np.asarray(expected))


@pytest.mark.vllm
async def test_vllm_stage_in_an_actor_matches_inline(ray_cluster, tiny_model):
    """vLLM's AsyncLLM (with its own engine-core process) inside the actor: greedy text unchanged."""
    folder = str(tiny_model("chat"))
    params = [{"max_tokens": 12, "temperature": 0.0}]
    texts = []
    for deploy in (None, RAY):
        async with AsyncOmni(folder, deploy_config=deploy, dtype="float32", max_model_len=512) as engine:
            texts.append((await final_output(engine.generate("hello there", sampling_params_list=params))).text)
    assert texts[0] and texts[0] == texts[1]
