"""The diffusion engine on the tiny Helios models (chunked, and the pyramid variant), checked against diffusers'
``HeliosPipeline`` / ``HeliosPyramidPipeline`` ``__call__`` (fp32, CPU)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.models.helios import DEFAULT_NUM_FRAMES, PIPELINE, PYRAMID, HeliosAdapter, HeliosPyramidAdapter
from omnistage.models.helios import adapter as helios_adapter
from omnistage.models.helios import pyramid as helios_pyramid
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

PROMPT = "a red cat on a blue chair"


folder, adapter, _ = tiny_family("helios", HeliosAdapter)  # (references: per test, some with other schedulers)


@pytest.fixture(scope="module")
def pyramid_folder(tiny_model):
    return str(tiny_model("helios_pyramid"))


@pytest.fixture(scope="module")
def pyramid_adapter(pyramid_folder):
    return HeliosPyramidAdapter.load(pyramid_folder, torch.float32, torch.device("cpu"))


def frames(out) -> np.ndarray:
    return (out.frames[0] * 255).round().astype(np.uint8)


def test_defaults_are_the_pipelines():
    from diffusers import HeliosPipeline, HeliosPyramidPipeline

    sig = inspect.signature(HeliosPipeline.__call__).parameters
    defaults = PIPELINE.stages[0].default_params
    assert defaults["num_inference_steps"] == sig["num_inference_steps"].default
    assert defaults["guidance_scale"] == sig["guidance_scale"].default
    assert sig["num_frames"].default == helios_adapter.CALL_NUM_FRAMES and DEFAULT_NUM_FRAMES == 129
    assert list(helios_adapter.HISTORY_SIZES) == sig["history_sizes"].default
    assert helios_adapter.CHUNK_LATENT_FRAMES == sig["num_latent_frames_per_chunk"].default
    assert sig["keep_first_frame"].default is True and sig["is_skip_first_chunk"].default is False
    psig = inspect.signature(HeliosPyramidPipeline.__call__).parameters
    assert psig["pyramid_num_inference_steps_list"].default == [helios_pyramid.DEFAULT_STAGE_STEPS] * 3
    assert PYRAMID.stages[0].default_params["num_inference_steps"] == helios_pyramid.DEFAULT_STAGE_STEPS


def test_frame_counts_round_as_the_pipeline_and_seconds_to_the_nearest(adapter):
    # whole chunks of 33, trimmed to 4k+1 (against HeliosPipeline itself: tests/models/test_video_frame_counts.py)
    made = {n: adapter.frames_for(n, nearest=False) for n in (1, 9, 33, 34, 66, 67, 132)}
    assert made == {1: 33, 9: 33, 33: 33, 34: 65, 66: 65, 67: 97, 132: 129}
    # a count derived from seconds x fps: the nearest of those (the longer on a tie: 49 is 16 from 33 and 65)
    near = {n: adapter.frames_for(n, nearest=True) for n in (9, 48, 49, 100)}
    assert near == {9: 33, 48: 33, 49: 65, 100: 97}


def test_families_resolve_from_the_folder(folder, pyramid_folder):
    from omnistage.pipeline import resolve_pipeline

    assert resolve_pipeline(folder).name == "helios"
    assert resolve_pipeline(pyramid_folder).name == "helios_pyramid"


@pytest.mark.parametrize("guidance", [5.0, 1.0])  # CFG (the default scale), none
async def test_solo_equals_diffusers_call(folder, adapter, guidance):
    ref = reference_pipeline("HeliosPipeline", folder)
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(height=32, width=32, num_frames=65, num_inference_steps=3, guidance_scale=guidance)  # two chunks
        outs = await run(engine, "a", PROMPT, seed=11, negative_prompt="blurry", **kw)
        want = frames(ref(PROMPT, negative_prompt="blurry", generator=gen(11), output_type="np", **kw))
        data = finished_data(outs)
        assert data["video"].shape == want.shape == (65, 32, 32, 3) and data["fps"] == helios_adapter.DEFAULT_FPS
        assert np.array_equal(data["video"], want)
        assert [o.progress for o in outs[:-1]] == [(0, 0)] + [
            (i, 6) for i in range(1, 6)
        ]  # taken, per step over both chunks
    finally:
        await engine.shutdown()


async def test_concurrent_requests_share_forwards_and_match_solo(folder, adapter):
    # other lengths and step counts: requests at different chunks still share a forward
    specs = [
        ("r0", "a red cat", dict(num_inference_steps=4, num_frames=65, seed=1, guidance_scale=5.0)),
        ("r1", "green square", dict(num_inference_steps=3, num_frames=33, seed=2, guidance_scale=1.0)),
        ("r2", PROMPT, dict(num_inference_steps=2, num_frames=97, seed=3, negative_prompt="blurry")),
    ]
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        solo, together, batches = await solo_then_staggered(engine, specs, output_type="latent", height=32, width=32)
        ref = reference_pipeline("HeliosPipeline", folder)
        want = ref(
            "a red cat",
            generator=gen(1),
            output_type="latent",
            height=32,
            width=32,
            num_frames=65,
            num_inference_steps=4,
        ).frames
        assert solo["r0"].shape == want.shape == (1, 16, 18, 4, 4) and torch.equal(solo["r0"], want)
        for (rid, _, _), got in zip(specs, together):
            assert max_diff(got, solo[rid]) <= 1e-5, rid
        assert batches[0] == ["r0"] and max(len(b) for b in batches) == 3
    finally:
        await engine.shutdown()


async def test_pyramid_solo_equals_diffusers_call(pyramid_folder, pyramid_adapter):
    ref = reference_pipeline("HeliosPyramidPipeline", pyramid_folder)
    engine = await start_engine(PYRAMID, pyramid_adapter, pyramid_folder)
    try:
        # two chunks of three stages (latents 2x2, 4x4, 8x8); the engine alone has no stage defaults: 5.0 given
        kw = dict(height=64, width=64, num_frames=65, guidance_scale=5.0)
        outs = await run(engine, "a", PROMPT, seed=5, negative_prompt="blurry", num_inference_steps=2, **kw)
        want = frames(
            ref(
                PROMPT,
                negative_prompt="blurry",
                generator=gen(5),
                output_type="np",
                pyramid_num_inference_steps_list=[2, 2, 2],
                **kw,
            )
        )
        data = finished_data(outs)
        assert data["video"].shape == want.shape == (65, 64, 64, 3)
        assert np.array_equal(data["video"], want)
        assert outs[-1].progress == (12, 12)
        # every forward ran one stage's latents: the key names the stage
        assert [key[-1] for key, _ in engine.forward_log] == [0, 0, 1, 1, 2, 2] * 2
    finally:
        await engine.shutdown()


async def test_pyramid_concurrent_requests_batch_by_stage(pyramid_folder, pyramid_adapter):
    specs = [
        ("p0", "a red cat", dict(num_inference_steps=2, num_frames=33, seed=1)),
        ("p1", "green square", dict(num_inference_steps=2, num_frames=65, seed=2, guidance_scale=1.0)),
        ("p2", PROMPT, dict(num_inference_steps=3, num_frames=33, seed=3)),
    ]
    engine = await start_engine(PYRAMID, pyramid_adapter, pyramid_folder)
    try:
        solo, together, batches = await solo_then_staggered(engine, specs, output_type="latent", height=64, width=64)
        for (rid, _, _), got in zip(specs, together):
            assert max_diff(got, solo[rid]) <= 1e-5, rid
        assert max(len(b) for b in batches) >= 2
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "pyramid,params,inputs,field",
    [
        (False, dict(height=40), {}, "height"),
        (False, dict(num_outputs_per_prompt=2), {}, "num_outputs_per_prompt"),
        (False, dict(guidance_scale_2=2.0), {}, "guidance_scale_2"),
        (False, {}, {"multi_modal_data": {"video": [Image.new("RGB", (64, 64))] * 9}}, "multi_modal_data.video"),
        (True, dict(width=32), {}, "width"),  # the pyramid's lowest stage needs multiples of 64
    ],
)
async def test_bad_params_name_the_field(
    folder, adapter, pyramid_folder, pyramid_adapter, pyramid, params, inputs, field
):
    engine = await (
        start_engine(PYRAMID, pyramid_adapter, pyramid_folder) if pyramid else start_engine(PIPELINE, adapter, folder)
    )
    try:
        kw = {"height": 64, "width": 64, "num_frames": 33, **params}
        with pytest.raises(ValueError, match=field):
            await run(engine, "bad", "a red cat", inputs=inputs, **kw)
        assert not engine.forward_log
    finally:
        await engine.shutdown()
