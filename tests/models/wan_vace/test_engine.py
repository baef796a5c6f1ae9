"""Wan VACE through ``AsyncOmni`` (fp32, CPU) against ``WanVACEPipeline.__call__`` on the tiny folder (same seed,
same steps): inpainting a source video under its mask, reference pictures, per-layer ``conditioning_scale``, a
control video without a mask, the size and length taken from the video, and no inputs at all; concurrent requests
share forwards; what the pipeline refuses, or a mask that does not fit its video, is an error naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.testing.staggered import generate_final, solo_then_staggered
from tests.models.wan_vace.conftest import STEPS, clip, mask_clip
from tests.stages.diffusion.helpers import noise_image

pytestmark = pytest.mark.slow  # an engine start and diffusers' pipeline: 20 s or more
ONE_LOOP = pytest.mark.asyncio(loop_scope="module")

PROMPT = "a red cat"
SIZE = dict(height=32, width=48)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(wan_vace_dir):
    engine = await AsyncOmni(wan_vace_dir).start()
    yield engine
    await engine.shutdown()


def _cases() -> dict[str, tuple[dict, dict, dict]]:
    """name -> (multi_modal_data, our params beyond STEPS, the reference's call arguments beyond STEPS)."""
    video, mask = clip(9, 32, 48, 10), mask_clip(9, 32, 48, 16)
    ref_pic = noise_image(24, 40, 3)  # another size: the pipeline fits it into the video's, on white
    scale = [0.5, 1.5]
    return {
        "inpaint": (
            {"video": video, "mask": mask},
            dict(SIZE, num_frames=9, guidance_scale=4.0),
            dict(SIZE, num_frames=9, guidance_scale=4.0, video=video, mask=mask, negative_prompt=None),
        ),
        "references-and-scale": (
            {"video": video, "mask": mask, "reference_images": [ref_pic]},
            dict(SIZE, num_frames=9, extra_args={"conditioning_scale": scale}),
            dict(SIZE, num_frames=9, video=video, mask=mask, reference_images=[ref_pic], conditioning_scale=scale),
        ),
        # a control video without a mask (every pixel regenerated); size and length default to the video's, 10
        # frames rounded to 9 as the pipeline rounds them
        "video-defaults": ({"video": clip(10, 32, 48, 30)}, {}, dict(SIZE, num_frames=10, video=clip(10, 32, 48, 30))),
        "references-only": (
            {"reference_images": ref_pic},
            dict(height=32, width=32, num_frames=5),
            dict(height=32, width=32, num_frames=5, reference_images=[ref_pic]),
        ),
        "text-only": ({}, dict(SIZE, num_frames=5, guidance_scale=1.0), dict(SIZE, num_frames=5, guidance_scale=1.0)),
    }


CASES = _cases()


@ONE_LOOP
@pytest.mark.parametrize("case", list(CASES))
async def test_request_equals_the_pipeline(omni, reference, case):
    mm, ours, theirs = CASES[case]
    prompt = {"prompt": PROMPT, **({"multi_modal_data": mm} if mm else {})}
    out = await generate_final(omni, prompt, {**STEPS, **ours, "seed": 7})
    want = reference(PROMPT, 7, **theirs)
    assert out.video.shape == want.shape and out.fps == 16
    # one request alone runs the pipeline's own operations in its order: the same frames, exactly
    np.testing.assert_array_equal(out.video, want)


@ONE_LOOP
async def test_concurrent_requests_share_forwards(omni):
    video = clip(9, 32, 48, 50)
    specs = [
        ({"prompt": PROMPT, "multi_modal_data": {"video": video, "mask": mask_clip(9, 32, 48, cols)}}, params)
        for cols, params in (
            (16, {"seed": 1}),
            (32, {"seed": 2, "extra_args": {"conditioning_scale": 0.3}}),
            (8, {"seed": 3, "guidance_scale": 1.0}),
        )
    ]
    # four steps: each request joins the one before it after that one's first step, before its last
    specs = [(p, {**STEPS, **SIZE, "num_frames": 9, "num_inference_steps": 4, **kw}) for p, kw in specs]
    alone, together, forwards = await solo_then_staggered(omni, specs)
    assert max(len(set(ids)) for ids in forwards) >= 2, forwards
    for a, b in zip(alone, together):
        # a forward of several rows differs from one of a single row by float batch variance in the GEMMs
        # (measured: one uint8 level on 2.4e-5 of the values, the rest equal)
        diff = np.abs(a.video.astype(int) - b.video.astype(int))
        assert diff.max() <= 1, diff.max()


REFUSED = {
    "mask-frames": ({"video": clip(9, 32, 48, 0), "mask": mask_clip(5, 32, 48, 8)}, {}, "multi_modal_data.mask"),
    "mask-size": ({"video": clip(9, 32, 48, 0), "mask": mask_clip(9, 32, 32, 8)}, {}, "multi_modal_data.mask"),
    "mask-without-video": ({"mask": mask_clip(9, 32, 48, 8)}, {}, "multi_modal_data.mask"),
    "bad-frame": ({"video": [np.zeros((32, 48), np.float32)]}, {}, "multi_modal_data.video[0]"),
    # more control frames than the video asked for: the DiT cannot take them (diffusers fails in the forward)
    "video-longer": ({"video": clip(17, 32, 48, 0)}, {"num_frames": 9}, "multi_modal_data.video"),
    "tiny-video": ({"video": clip(1, 8, 8, 0)}, {"height": 32, "width": 32}, "multi_modal_data.video"),
    "scale-length": ({}, {"extra_args": {"conditioning_scale": [1.0, 1.0, 1.0]}}, "conditioning_scale"),
    "strength": ({"image": noise_image(32, 32, 0)}, {"strength": 0.5}, "strength"),
}


@ONE_LOOP
@pytest.mark.parametrize("case", list(REFUSED))
async def test_refused_inputs_name_the_field(omni, case):
    mm, params, field = REFUSED[case]
    prompt = {"prompt": PROMPT, **({"multi_modal_data": mm} if mm else {})}
    with pytest.raises(InvalidRequestError) as err:
        await generate_final(omni, prompt, {**STEPS, **SIZE, "num_frames": 9, **params})
    assert err.value.field == field, err.value
