"""The diffusion engine on the tiny HunyuanVideo-1.5 models, checked against diffusers'
``HunyuanVideo15Pipeline`` / ``HunyuanVideo15ImageToVideoPipeline`` ``__call__`` (fp32, CPU)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.models.hunyuan_video15 import PIPELINE, HunyuanVideo15Adapter
from omnistage.models.hunyuan_video15 import adapter as hy_adapter
from tests.stages.diffusion.helpers import (
    finished_data,
    gen,
    max_diff,
    reference_pipeline,
    run,
    solo_then_staggered,
    start_engine,
    tiny_family,
)

SMALL = dict(height=16, width=32, num_frames=5)  # latents [1, 4, 3, 4, 8]
PROMPT = 'a red cat holding a sign that says "hi"'  # quoted text: the ByT5 glyph encoder runs too


folder, adapter, _ = tiny_family("hunyuan_video15", HunyuanVideo15Adapter)  # (its reference sets the guider: below)


def reference(cls: str, folder: str, guidance: float | None):
    """diffusers' pipeline, its guider at the request's scale (the folder's, 6.0, when the request sets none)."""
    from diffusers.guiders import ClassifierFreeGuidance

    pipe = reference_pipeline(cls, folder)
    if guidance is not None:
        pipe.guider = ClassifierFreeGuidance(guidance_scale=guidance)
    return pipe


def frames(out) -> np.ndarray:
    return (out.frames[0] * 255).round().astype(np.uint8)


def test_defaults_are_the_pipelines():
    from diffusers import HunyuanVideo15Pipeline

    sig = inspect.signature(HunyuanVideo15Pipeline.__call__).parameters
    defaults = PIPELINE.stages[0].default_params
    assert defaults["num_inference_steps"] == sig["num_inference_steps"].default
    assert defaults["num_frames"] == sig["num_frames"].default
    assert "guidance_scale" not in defaults  # the folder's guider decides


def test_family_resolves_from_the_folder(folder, tiny_model):
    from omnistage.pipeline import resolve_pipeline

    assert resolve_pipeline(folder).name == "hunyuan_video15"
    assert resolve_pipeline(str(tiny_model("hunyuan_video15_i2v"))).name == "hunyuan_video15"


@pytest.mark.parametrize("guidance", [None, 1.0, 3.5])  # the folder's 6.0, no CFG, the request's own scale
async def test_solo_equals_diffusers_call(folder, adapter, guidance):
    ref = reference("HunyuanVideo15Pipeline", folder, guidance)
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(num_inference_steps=3, **SMALL)
        extra = {} if guidance is None else {"guidance_scale": guidance}
        outs = await run(engine, "a", PROMPT, seed=11, negative_prompt="blurry", **kw, **extra)
        data = finished_data(outs)
        want = frames(ref(PROMPT, negative_prompt="blurry", generator=gen(11), output_type="np", **kw))
        assert data["video"].shape == (5, 16, 32, 3) and data["fps"] == hy_adapter.DEFAULT_FPS
        assert np.array_equal(data["video"], want)
        assert [o.progress for o in outs[:-1]] == [(0, 0), (1, 3), (2, 3)]
    finally:
        await engine.shutdown()


async def test_concurrent_requests_share_forwards_and_match_solo(folder, adapter):
    specs = [
        ("r0", "a red cat", dict(num_inference_steps=6, seed=1, guidance_scale=5.0)),
        ("r1", "green square", dict(num_inference_steps=4, seed=2, guidance_scale=1.0)),
        ("r2", PROMPT, dict(num_inference_steps=5, seed=3, negative_prompt="blurry")),
    ]
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        solo, together, batches = await solo_then_staggered(engine, specs, output_type="latent", **SMALL)
        for (rid, _, _), got in zip(specs, together):
            assert max_diff(got, solo[rid]) <= 1e-5, rid
        assert batches[0] == ["r0"] and max(len(b) for b in batches) == 3
    finally:
        await engine.shutdown()


async def test_videos_finishing_together_decode(folder, adapter):
    """Two requests finishing on the same step get their videos (diffusers' VAE fails on a batch of two)."""
    import asyncio

    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(num_inference_steps=2, guidance_scale=1.0, **SMALL)
        solo = finished_data(await run(engine, "solo", "a red cat", seed=1, **kw))["video"]
        engine.forward_log.clear()
        outs = await asyncio.gather(
            run(engine, "a", "a red cat", seed=1, **kw), run(engine, "b", "green square", seed=2, **kw)
        )
        assert [len(ids) for _, ids in engine.forward_log] == [2, 2]  # admitted together, finished together
        assert np.array_equal(finished_data(outs[0])["video"], solo)
        assert finished_data(outs[1])["video"].shape == solo.shape
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "params,inputs,field",
    [
        (dict(width=None), {}, "width"),  # one side alone
        (dict(height=18, width=32), {}, "height"),
        (dict(max_sequence_length=64), {}, "max_sequence_length"),
        (dict(num_outputs_per_prompt=2), {}, "num_outputs_per_prompt"),
        ({}, {"multi_modal_data": {"image": Image.new("RGB", (32, 32))}}, "multi_modal_data.image"),
    ],
)
async def test_bad_params_name_the_field(folder, adapter, params, inputs, field):
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        with pytest.raises(ValueError, match=field):
            await run(engine, "bad", "a red cat", inputs=inputs, **{**SMALL, **params})
        assert not engine.forward_log
    finally:
        await engine.shutdown()


async def test_i2v_solo_equals_diffusers_call(tiny_model):
    folder = str(tiny_model("hunyuan_video15_i2v"))
    adapter = HunyuanVideo15Adapter.load(folder, torch.float32, torch.device("cpu"))
    assert type(adapter).__name__ == "HunyuanVideo15I2VAdapter"
    ref = reference("HunyuanVideo15ImageToVideoPipeline", folder, 4.0)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (20, 36, 3), dtype=np.uint8))
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(num_inference_steps=3, num_frames=5)
        outs = await run(
            engine, "a", PROMPT, inputs={"multi_modal_data": {"image": image}}, seed=3, guidance_scale=4.0, **kw
        )
        want = frames(ref(image=image, prompt=PROMPT, generator=gen(3), output_type="np", **kw))
        data = finished_data(outs)
        assert data["video"].shape == want.shape == (5, 12, 20, 3)  # the model's target area at the image's aspect
        assert np.array_equal(data["video"], want)
        with pytest.raises(ValueError, match="height"):
            await run(engine, "sized", PROMPT, inputs={"multi_modal_data": {"image": image}}, height=16, **kw)
    finally:
        await engine.shutdown()
