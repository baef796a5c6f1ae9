"""The diffusion engine on the tiny Cosmos3 folder, checked against diffusers' Cosmos3OmniPipeline (fp32, CPU)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from omnistage.models.cosmos3 import PIPELINE, Cosmos3Adapter
from omnistage.models.cosmos3 import adapter as cosmos3_adapter
from omnistage.stages.base import StageRequest
from tests.stages.diffusion.helpers import finished_data, gen, max_diff, run, solo_then_staggered, tiny_family
from tests.stages.diffusion.helpers import start_engine as _start

VIDEO = dict(height=32, width=48, num_frames=9)  # latents [1, 4, 3, 4, 6]


cosmos3, adapter, ref = tiny_family("cosmos3", Cosmos3Adapter, "Cosmos3OmniPipeline", folder="cosmos3")


def _uint8(frames: np.ndarray) -> np.ndarray:
    """diffusers' np video [T, H, W, 3] in [0, 1] -> uint8, rounded as diffusers rounds for PIL."""
    return (np.asarray(frames) * 255).round().astype(np.uint8)


def test_defaults_are_the_pipelines():
    from diffusers import Cosmos3OmniPipeline

    sig = inspect.signature(Cosmos3OmniPipeline.__call__).parameters
    defaults = PIPELINE.stages[0].default_params
    assert defaults["num_inference_steps"] == sig["num_inference_steps"].default
    assert defaults["guidance_scale"] == sig["guidance_scale"].default
    assert defaults["fps"] == sig["fps"].default
    # __call__ fills None sizes with these (its docstring and body); the adapter does the same
    src = inspect.getsource(Cosmos3OmniPipeline.__call__)
    for name, value in (
        ("num_frames", cosmos3_adapter.DEFAULT_NUM_FRAMES),
        ("height", cosmos3_adapter.DEFAULT_HEIGHT),
        ("width", cosmos3_adapter.DEFAULT_WIDTH),
    ):
        assert f"{name} = {value}" in src


def test_a_folder_asking_for_the_guardrail_loads_without_it(cosmos3, tmp_path):
    """Released folders set enable_safety_checker (the cosmos_guardrail package, not installed here): they load."""
    import json
    import shutil

    folder = tmp_path / "guarded"
    shutil.copytree(cosmos3, folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "enable_safety_checker": True}))
    adapter = Cosmos3Adapter.load(str(folder), torch.float32, torch.device("cpu"))
    assert adapter.pipe.safety_checker is None


def test_family_resolves_from_the_folder(cosmos3):
    from omnistage.pipeline import resolve_pipeline

    assert resolve_pipeline(cosmos3).name == "cosmos3"


@pytest.mark.parametrize("guidance", [6.0, 1.0])
async def test_text_to_image_equals_diffusers(cosmos3, adapter, ref, guidance):
    engine = await _start(PIPELINE, adapter, cosmos3)
    try:
        kw = dict(num_inference_steps=4, guidance_scale=guidance, height=32, width=32)
        outs = await run(engine, "a", "a red cat", seed=5, num_frames=1, **kw)
        expected = ref("a red cat", generator=gen(5), num_frames=1, output_type="np", **kw).video
        data = finished_data(outs)
        assert len(data["image"]) == 1 and data["image"][0].shape == (32, 32, 3)
        assert np.array_equal(data["image"][0], _uint8(expected)[0])
    finally:
        await engine.shutdown()


async def test_text_to_video_equals_diffusers(cosmos3, adapter, ref):
    engine = await _start(PIPELINE, adapter, cosmos3)
    try:
        kw = dict(num_inference_steps=4, guidance_scale=6.0, **VIDEO)
        outs = await run(engine, "a", "a red cat", seed=7, negative_prompt="blurry", fps=12, **kw)
        expected = ref("a red cat", generator=gen(7), negative_prompt="blurry", fps=12.0, output_type="np", **kw)
        data = finished_data(outs)
        assert data["video"].shape == (9, 32, 48, 3) and data["fps"] == 12
        assert np.array_equal(data["video"], _uint8(expected.video))
        assert "audio" not in data
    finally:
        await engine.shutdown()


async def test_text_to_video_with_sound_equals_diffusers(cosmos3, adapter, ref):
    engine = await _start(PIPELINE, adapter, cosmos3)
    try:
        kw = dict(num_inference_steps=3, guidance_scale=6.0, **VIDEO)
        outs = await run(engine, "a", "waves on a beach", seed=9, extra_args={"enable_sound": True}, **kw)
        expected = ref("waves on a beach", generator=gen(9), enable_sound=True, output_type="np", **kw)
        data = finished_data(outs)
        assert np.array_equal(data["video"], _uint8(expected.video))
        assert data["sample_rate"] == 16000 and data["audio"].shape == expected.sound.shape  # stereo [2, samples]
        assert max_diff(data["audio"], expected.sound) == 0.0
    finally:
        await engine.shutdown()


async def test_concurrent_requests_share_steps_and_match_solo(cosmos3, adapter):
    """Different prompts, seeds, step counts and guidance (incl. 1: no uncond pass), each joining a running
    batch: every request's latents equal its solo run exactly (each row is its own transformer call)."""
    specs = [
        ("r0", "a red cat", dict(num_inference_steps=6, seed=1, guidance_scale=6.0)),
        ("r1", "green square", dict(num_inference_steps=4, seed=2, guidance_scale=1.0)),
        ("r2", "city skyline", dict(num_inference_steps=5, seed=3, guidance_scale=3.0, negative_prompt="blurry")),
    ]
    engine = await _start(PIPELINE, adapter, cosmos3)
    try:
        solo, together, batches = await solo_then_staggered(engine, specs, output_type="latent", **VIDEO)
        for (rid, _, _), got in zip(specs, together):
            assert torch.equal(got, solo[rid]), rid
        assert max(len(b) for b in batches) == 3  # all three advanced at one step boundary
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "params, inputs, field",
    [
        (dict(height=36), {}, "height"),
        (dict(num_frames=1, extra_args={"enable_sound": True}), {}, "enable_sound"),
        (dict(num_outputs_per_prompt=2), {}, "num_outputs_per_prompt"),
        (dict(num_frames=1), "image", "multi_modal_data.image"),  # text-to-image takes no input image
    ],
)
async def test_bad_requests_name_the_field(cosmos3, adapter, params, inputs, field):
    from PIL import Image

    from omnistage.errors import InvalidRequestError

    engine = await _start(PIPELINE, adapter, cosmos3)
    try:
        extra = {"multi_modal_data": {"image": [Image.new("RGB", (32, 32))]}} if inputs == "image" else {}
        kw = {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2, **params}
        with pytest.raises(InvalidRequestError) as e:
            async for _ in engine.generate(StageRequest("bad", {"prompt": "x", **extra}, kw)):
                pass
        assert e.value.field == field
    finally:
        await engine.shutdown()


def test_action_outputs_are_checked_at_start_up():
    """A deploy may narrow the stage to its actions' combinations; a video family without actions cannot be asked
    for them (start-up fails naming the field), nor can the stage be asked for an output it has no head for."""
    from omnistage.config import ConfigError
    from omnistage.engine.builder import resolve_deploy
    from omnistage.models.wan import PIPELINE as WAN

    for narrowed in ("video+action", "video+audio+action"):
        deploy = resolve_deploy(PIPELINE, {"stages": [{"stage_id": 0, "engine_output_type": narrowed}]})
        assert deploy.stages[0].engine_output_type == narrowed
    with pytest.raises(ConfigError, match="engine_output_type: stage 0 .* cannot produce action"):
        resolve_deploy(WAN, {"stages": [{"stage_id": 0, "engine_output_type": "video+action"}]})
    with pytest.raises(ConfigError, match="cannot produce text"):
        resolve_deploy(PIPELINE, {"stages": [{"stage_id": 0, "engine_output_type": "video+text"}]})
