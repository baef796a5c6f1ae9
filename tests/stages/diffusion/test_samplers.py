"""Every sampler path on the tiny SD 1.5 UNet: vectorised (Euler, DDIM) and per-request multistep state
(UniPC, DPM++), each against diffusers' StableDiffusionPipeline with the same scheduler."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistage.models.sd import PIPELINE, SDAdapter
from omnistage.stages.diffusion import samplers

from .helpers import gen, max_diff, reference_pipeline, run, start_engine

SCHEDULERS = {
    "DDIMScheduler": samplers.DDIMSampler,
    "EulerDiscreteScheduler": samplers.EulerSampler,
    "UniPCMultistepScheduler": samplers.SchedulerSampler,
    "DPMSolverMultistepScheduler": samplers.SchedulerSampler,
}


@pytest.fixture(scope="module")
def sd15(tiny_model):
    return str(tiny_model("sd15"))


@pytest.mark.parametrize("name", list(SCHEDULERS))
async def test_sampler_solo_exact_and_batched_close(sd15, name):
    import diffusers

    pipe = reference_pipeline("StableDiffusionPipeline", sd15)
    pipe.scheduler = getattr(diffusers, name).from_config(pipe.scheduler.config)
    adapter = SDAdapter(pipe, torch.float32, torch.device("cpu"))
    assert type(adapter.sampler) is SCHEDULERS[name]
    engine = await start_engine(PIPELINE, adapter, sd15)
    try:
        a = dict(num_inference_steps=8, guidance_scale=5.0, height=32, width=32, output_type="latent")
        b = dict(num_inference_steps=5, guidance_scale=1.0, height=32, width=32, output_type="latent")
        solo_a = (await run(engine, "a0", "a red cat", seed=1, **a))[-1].data["latent"]
        solo_b = (await run(engine, "b0", "green square", seed=2, **b))[-1].data["latent"]
        assert max_diff(solo_a, pipe("a red cat", generator=gen(1), **a).images) == 0.0
        started = asyncio.Event()
        ta = asyncio.create_task(run(engine, "a", "a red cat", seed=1, started=started, **a))
        await started.wait()
        outs_b = await run(engine, "b", "green square", seed=2, **b)  # joins at step >= 1, leaves first
        outs_a = await ta
        assert any(len(ids) == 2 for _, ids in engine.forward_log)
        assert max_diff(outs_a[-1].data["latent"], solo_a) <= 1e-5 * max(1.0, solo_a.abs().max().item())
        assert max_diff(outs_b[-1].data["latent"], solo_b) <= 1e-5 * max(1.0, solo_b.abs().max().item())
    finally:
        await engine.shutdown()
