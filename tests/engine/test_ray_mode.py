"""Stages as Ray actors (distributed_executor_backend: ray) on a local `ray start --head` cluster:
same results as in-process, streaming edges, bad input, actor death and restart."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage import AsyncOmni, InvalidRequestError, StageFailedError
from omnistage.pipeline import Pipeline, StageSpec
from omnistage.testing import pipelines as tp

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
RAY = {"distributed_executor_backend": "ray"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A real single-node cluster, as `ray start --head` makes it; the test process joins as a driver."""
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    port = _free_port()
    # no token auth: a head started here would otherwise pick up a stale ~/.ray/auth_token that this
    # driver does not send
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats", f"--temp-dir={tmp_path_factory.mktemp('ray')}"],
                   check=True, env=env, capture_output=True)
    os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
    try:
        yield os.environ["RAY_ADDRESS"]
    finally:
        import ray

        ray.shutdown()
        os.environ.pop("RAY_ADDRESS", None)
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True)


async def _final(engine, prompt, params=None):
    out = None
    async for o in engine.generate(prompt, sampling_params_list=params):
        out = o
    return out


async def test_ray_stages_give_identical_results_to_inline(ray_cluster):
    prompts = ["one", "two two", "three three three"]
    async with AsyncOmni(pipeline=tp.chain()) as inline:
        expected = [(await _final(inline, p)).latents for p in prompts]
    async with AsyncOmni(pipeline=tp.chain(), deploy_config=RAY) as engine:
        replicas = [c.replicas[0] for c in engine._orch.clients.values()]
        assert {type(r).__name__ for r in replicas} == {"RayStageEngine"}
        pids = {await r.pid() for r in replicas}
        assert os.getpid() not in pids and len(pids) == 3  # three actors, none of them this process
        for p, e in zip(prompts, expected):
            assert torch.equal((await _final(engine, p)).latents, e)
        with pytest.raises(StageFailedError, match="boom"):  # a stage fault fails that request only
            await _final(engine, "boom")
        assert engine.is_ready


async def test_streaming_edge_and_bad_input_across_actors(ray_cluster):
    async with AsyncOmni(pipeline=tp.streaming()) as inline:
        expected = await _final(inline, "a b c d e", [{"max_tokens": 7}, {}])
    async with AsyncOmni(pipeline=tp.streaming(), deploy_config=RAY) as engine:
        got = await _final(engine, "a b c d e", [{"max_tokens": 7}, {}])
        assert torch.equal(got.latents, expected.latents)
        with pytest.raises(InvalidRequestError, match="max_tokens"):
            await _final(engine, "x", [{"max_tokens": -1}, {}])
        assert (await _final(engine, "x", [{"max_tokens": 2}, {}])).finished


async def test_dying_actor_fails_in_flight_requests_and_is_restarted(ray_cluster):
    p = Pipeline("test_slow_ray", [StageSpec(0, kind="llm", engine=tp.TokenStreamEngine, output="token_ids",
                                             final=True)])
    async with AsyncOmni(pipeline=p, deploy_config=RAY) as engine:
        replica = engine._orch.clients[0].replicas[0]
        old = await replica.pid()
        task = asyncio.create_task(_final(engine, "x", [{"max_tokens": 1000, "delay": 0.01}]))
        await asyncio.sleep(0.5)
        os.kill(old, signal.SIGKILL)
        with pytest.raises(StageFailedError, match="Ray actor died"):
            await asyncio.wait_for(task, 30)
        for _ in range(600):  # the replacement actor comes up and serves again
            if engine.is_ready:
                break
            await asyncio.sleep(0.1)
        assert engine.is_ready and replica.restarts == 1 and await replica.pid() != old
        out = await _final(engine, "x", [{"max_tokens": 3}])
        assert out.finished and len(out.token_ids) == 3


async def test_diffusion_family_on_ray_equals_diffusers(ray_cluster, tiny_model):
    """A real family (tiny SD3) in an actor: the image still equals diffusers' own pipeline."""
    from diffusers import StableDiffusion3Pipeline

    folder = str(tiny_model("sd3"))
    kw = dict(num_inference_steps=3, guidance_scale=4.0, height=32, width=32)
    async with AsyncOmni(folder, deploy_config=RAY) as engine:
        out = await _final(engine, "a red cat", [dict(seed=3, **kw)])
    ref = StableDiffusion3Pipeline.from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
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
            texts.append((await _final(engine, "hello there", params)).text)
    assert texts[0] and texts[0] == texts[1]
