"""The diffusion engine on tiny SD 1.5 (PNDM, per-request multistep state) and SDXL (Euler, time ids),
checked against diffusers' own pipelines (fp32, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.models.sd import PIPELINE, SDAdapter
from tests.stages.diffusion.helpers import (
    gen,
    latent,
    max_diff,
    reference_pipeline,
    run,
    solo_then_staggered,
    start_engine,
)

CLASSES = {
    "sd15": ("StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline"),
    "sdxl": ("StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline"),
}


@pytest.fixture(scope="module", params=["sd15", "sdxl"])
def family(request, tiny_model):
    folder = str(tiny_model(request.param))
    refs = [reference_pipeline(cls, folder) for cls in CLASSES[request.param]]
    return folder, SDAdapter.load(folder, torch.float32, torch.device("cpu")), refs


async def test_solo_equals_diffusers_call(family):
    folder, adapter, (ref, _) = family
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(num_inference_steps=5, guidance_scale=6.0, height=32, width=48)
        outs = await run(engine, "a", "a red cat", seed=3, output_type="latent", **kw)
        assert max_diff(latent(outs), ref("a red cat", generator=gen(3), output_type="latent", **kw).images) == 0.0
        outs = await run(engine, "b", "a red cat", seed=3, negative_prompt="ugly", num_outputs_per_prompt=2, **kw)
        expected = ref("a red cat", generator=gen(3), negative_prompt="ugly", num_images_per_prompt=2, **kw).images
        assert len(outs[-1].data["image"]) == 2
        for got, want in zip(outs[-1].data["image"], expected):
            assert np.array_equal(got, np.asarray(want))
    finally:
        await engine.shutdown()


async def test_concurrent_requests_match_their_solo_results(family):
    folder, adapter, _ = family
    specs = [
        ("r0", "a red cat", dict(num_inference_steps=10, seed=1, guidance_scale=7.5)),
        ("r1", "green square", dict(num_inference_steps=7, seed=2, guidance_scale=1.0)),
        ("r2", "blue chair", dict(num_inference_steps=6, seed=3, guidance_scale=3.0, num_outputs_per_prompt=2)),
        ("r3", "city skyline", dict(num_inference_steps=5, seed=4, guidance_scale=5.0, negative_prompt="blurry")),
    ]
    common = dict(height=32, width=32, output_type="latent")
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        solo, together, batches = await solo_then_staggered(engine, specs, **common)
        for (rid, _, _), got in zip(specs, together):
            # 1e-5 on unit-scale values: the random tiny SDXL UNet leaves Euler latents at |x| ~ 12
            scale = max(1.0, solo[rid].abs().max().item())
            assert max_diff(got, solo[rid]) <= 1e-5 * scale, rid
        assert batches[0] == ["r0"] and max(len(b) for b in batches) == 4
    finally:
        await engine.shutdown()


async def test_img2img_equals_diffusers_img2img(family):
    folder, adapter, (_, ref) = family
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 255, (32, 40, 3), dtype=np.uint8))
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(num_inference_steps=8, strength=0.5, guidance_scale=4.0)
        outs = await run(
            engine, "i", "a red cat", inputs={"multi_modal_data": {"image": image}}, seed=9, output_type="latent", **kw
        )
        expected = ref("a red cat", image=image, generator=gen(9), output_type="latent", **kw).images
        assert latent(outs).shape[-2:] == (16, 20)  # the input's size, like diffusers
        assert max_diff(latent(outs), expected) == 0.0
    finally:
        await engine.shutdown()


async def test_sdxl_micro_conditioning_knobs(family):
    folder, adapter, (ref, _) = family
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(num_inference_steps=3, guidance_scale=5.0, height=32, width=32, output_type="latent")
        extra = {"original_size": [64, 64], "crops_coords_top_left": [4, 0]}
        if type(adapter).__name__ != "SDXLAdapter":
            with pytest.raises(ValueError, match="extra_args.original_size"):
                await run(engine, "x", "a red cat", seed=1, extra_args=extra, **kw)
            return
        outs = await run(engine, "x", "a red cat", seed=1, extra_args=extra, **kw)
        expected = ref("a red cat", generator=gen(1), original_size=(64, 64), crops_coords_top_left=(4, 0), **kw).images
        assert max_diff(latent(outs), expected) == 0.0
    finally:
        await engine.shutdown()
