"""The diffusion engine on the tiny Wan text-to-video model, checked against diffusers' WanPipeline (fp32, CPU)."""

from __future__ import annotations

import asyncio
import inspect

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.models.wan import PIPELINE, WanAdapter
from omnistage.models.wan import adapter as wan_adapter
from omnistage.models.wan.tiny import build_wan22
from omnistage.stages.base import StageRequest
from tests.stages.diffusion.helpers import (
    finished_data,
    gen,
    latent,
    max_diff,
    reference_pipeline,
    run,
    solo_then_staggered,
    start_engine,
    tiny_family,
)

SMALL = dict(height=32, width=32, num_frames=5, max_sequence_length=16)  # latents [1, 16, 2, 4, 4]


wan, adapter, ref = tiny_family("wan", WanAdapter, "WanPipeline", folder="wan")


def _ref_frames(frames: np.ndarray) -> np.ndarray:
    """diffusers' np video [1, T, H, W, 3] in [0, 1] -> uint8 frames, rounded as diffusers rounds for PIL."""
    return (frames[0] * 255).round().astype(np.uint8)


def test_defaults_are_the_pipelines():
    from diffusers import WanPipeline

    sig = inspect.signature(WanPipeline.__call__).parameters
    defaults = PIPELINE.stages[0].default_params
    assert defaults["num_inference_steps"] == sig["num_inference_steps"].default
    assert defaults["guidance_scale"] == sig["guidance_scale"].default
    assert defaults["num_frames"] == sig["num_frames"].default
    assert wan_adapter.DEFAULT_HEIGHT == sig["height"].default and wan_adapter.DEFAULT_WIDTH == sig["width"].default
    assert wan_adapter.MAX_SEQUENCE_LENGTH == sig["max_sequence_length"].default


def test_family_resolves_from_the_folder(wan):
    from omnistage.pipeline import resolve_pipeline

    assert resolve_pipeline(wan).name == "wan"


@pytest.mark.parametrize("guidance", [5.0, 1.0])
async def test_solo_equals_diffusers_call(wan, adapter, ref, guidance):
    engine = await start_engine(PIPELINE, adapter, wan)
    try:
        kw = dict(num_inference_steps=4, guidance_scale=guidance, **SMALL)
        outs = await run(engine, "a", "a red cat on a chair", seed=11, output_type="latent", **kw)
        expected = ref("a red cat on a chair", generator=gen(11), output_type="latent", **kw).frames
        assert latent(outs).shape == (1, 16, 2, 4, 4)
        assert max_diff(latent(outs), expected) == 0.0
        assert [o.progress for o in outs[:-1]] == [(0, 0)] + [(i, 4) for i in range(1, 4)]
        assert outs[-1].metrics.num_steps == 4

        outs = await run(engine, "b", "a red cat on a chair", seed=11, negative_prompt="blurry, static", **kw)
        expected = ref("a red cat on a chair", generator=gen(11), negative_prompt="blurry, static", **kw).frames
        data = finished_data(outs)
        assert data["video"].dtype == np.uint8 and data["video"].shape == (5, 32, 32, 3)
        assert data["fps"] == 16
        assert np.array_equal(data["video"], _ref_frames(expected))
    finally:
        await engine.shutdown()


async def test_default_text_length_and_rectangular_size(wan, adapter, ref):
    """The pipeline's own max_sequence_length (512) and a non-square size with more frames."""
    engine = await start_engine(PIPELINE, adapter, wan)
    try:
        kw = dict(num_inference_steps=3, guidance_scale=4.0, height=16, width=48, num_frames=9)
        outs = await run(engine, "a", "city skyline at night", seed=3, fps=8, **kw)
        expected = ref("city skyline at night", generator=gen(3), **kw).frames
        data = finished_data(outs)
        assert data["video"].shape == (9, 16, 48, 3) and data["fps"] == 8
        assert np.array_equal(data["video"], _ref_frames(expected))
    finally:
        await engine.shutdown()


async def test_concurrent_requests_share_forwards_and_match_solo(wan, adapter):
    """Different prompts, seeds, step counts and guidance (incl. <= 1), each joining a running batch."""
    specs = [
        ("r0", "a red cat", dict(num_inference_steps=8, seed=1, guidance_scale=5.0)),
        ("r1", "green square", dict(num_inference_steps=5, seed=2, guidance_scale=1.0)),
        ("r2", "city skyline", dict(num_inference_steps=6, seed=3, guidance_scale=3.0, negative_prompt="blurry")),
    ]
    common = dict(output_type="latent", **SMALL)
    engine = await start_engine(PIPELINE, adapter, wan)
    try:
        solo, together, batches = await solo_then_staggered(engine, specs, **common)
        for (rid, _, _), got in zip(specs, together):
            assert max_diff(got, solo[rid]) <= 1e-5, rid
        assert batches[0] == ["r0"]
        assert max(len(b) for b in batches) == 3  # all three shared a forward
        assert len(batches) < sum(kw["num_inference_steps"] for _, _, kw in specs)
    finally:
        await engine.shutdown()


async def test_batched_decode_gives_each_request_its_video(wan, adapter, ref):
    engine = await start_engine(PIPELINE, adapter, wan)
    try:
        kw = dict(num_inference_steps=3, guidance_scale=5.0, **SMALL)
        a, b = await asyncio.gather(
            run(engine, "a", "a red cat", seed=1, **kw), run(engine, "b", "green square", seed=2, **kw)
        )
        assert any(len(ids) == 2 for _, ids in engine.forward_log)
        for outs, prompt, seed in ((a, "a red cat", 1), (b, "green square", 2)):
            want = _ref_frames(ref(prompt, generator=gen(seed), **kw).frames)
            got = finished_data(outs)["video"]
            # batched with another request: float batch variance may move a pixel by one uint8 level at most
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    finally:
        await engine.shutdown()


async def test_frame_counts_are_separate_batch_keys(wan, adapter):
    engine = await start_engine(PIPELINE, adapter, wan)
    try:
        kw = dict(num_inference_steps=3, output_type="latent", height=32, width=32, max_sequence_length=16)
        a, b = await asyncio.gather(
            run(engine, "a", "a red cat", seed=1, num_frames=5, **kw),
            run(engine, "b", "a red cat", seed=1, num_frames=9, **kw),
        )
        assert latent(a).shape[2] == 2 and latent(b).shape[2] == 3
        assert all(ids in (["a"], ["b"]) for _, ids in engine.forward_log)
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "params,inputs,field",
    [
        (dict(num_frames=0), {}, "num_frames"),
        (dict(height=24), {}, "height"),
        (dict(width=40), {}, "width"),
        (dict(num_outputs_per_prompt=2), {}, "num_outputs_per_prompt"),
        (dict(guidance_scale_2=3.0), {}, "guidance_scale_2"),
        (dict(output_type="gif"), {}, "output_type"),
        (dict(fps=0), {}, "fps"),
        (dict(max_sequence_length=0), {}, "max_sequence_length"),
        ({}, {"multi_modal_data": {"image": Image.new("RGB", (32, 32))}}, "multi_modal_data.image"),
    ],
)
async def test_bad_params_name_the_field_and_disturb_nothing(wan, adapter, params, inputs, field):
    engine = await start_engine(PIPELINE, adapter, wan)
    try:
        kw = dict(num_inference_steps=3, output_type="latent", seed=3, **SMALL)
        solo = latent(await run(engine, "solo", "a red cat", **kw))
        started = asyncio.Event()
        good = asyncio.create_task(run(engine, "good", "a red cat", started=started, **kw))
        await started.wait()
        with pytest.raises(ValueError, match=field):
            await run(engine, "bad", "a red cat", inputs=inputs, **{**SMALL, **params})
        assert max_diff(latent(await good), solo) <= 1e-5
    finally:
        await engine.shutdown()


# ----------------------------------------------------------------- Wan2.2: two experts split at a boundary


@pytest.fixture(scope="module")
def wan22(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-wan22")
    build_wan22(folder)
    return str(folder)


async def test_wan22_experts_and_guidance_scale_2(wan22):
    ref = reference_pipeline("WanPipeline", wan22)
    adapter = WanAdapter.load(wan22, torch.float32, torch.device("cpu"))
    engine = await start_engine(PIPELINE, adapter, wan22)
    try:
        # 6 steps with flow shift 3 put the first steps above the 875 boundary and the rest below it
        kw = dict(num_inference_steps=6, guidance_scale=4.0, guidance_scale_2=2.0, output_type="latent", **SMALL)
        t = adapter.sampler.make_state(6).timesteps
        assert (t >= 875).any() and (t < 875).any()
        solo = latent(await run(engine, "solo", "a red cat", seed=5, **kw))
        assert max_diff(solo, ref("a red cat", generator=gen(5), **kw).frames) == 0.0
        other = dict(kw, guidance_scale_2=None)  # defaults to guidance_scale, as in diffusers
        solo_b = latent(await run(engine, "solo-b", "green square", seed=6, **other))
        assert max_diff(solo_b, ref("green square", generator=gen(6), **other).frames) == 0.0

        # a (12 steps) is past the boundary when b starts at t=999: shared forwards hold rows for both experts
        long = dict(kw, num_inference_steps=12)
        solo_a = latent(await run(engine, "solo-a", "a red cat", seed=5, **long))
        low_from = next(i for i, v in enumerate(adapter.sampler.make_state(12).timesteps) if v < 875)
        seen_t = []
        predict = adapter.predict
        adapter.predict = lambda x, t, cond: seen_t.append(t.clone()) or predict(x, t, cond)  # spy on the rows' t
        engine.forward_log.clear()
        a_outs, b = [], None
        async for o in engine.generate(StageRequest("a", {"prompt": "a red cat"}, dict(long, seed=5))):
            a_outs.append(o)
            if b is None and o.progress and o.progress[0] >= low_from:
                b = asyncio.create_task(run(engine, "b", "green square", seed=6, **other))
        assert max_diff(latent(a_outs), solo_a) <= 1e-5
        assert max_diff(latent(await b), solo_b) <= 1e-5
        assert any(len(ids) == 2 for _, ids in engine.forward_log)
        assert any(bool((t >= 875).any() and (t < 875).any()) for t in seen_t)
    finally:
        await engine.shutdown()
