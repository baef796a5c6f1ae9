"""Helios image-to-video and video-to-video offline: ``Omni`` with ``multi_modal_data`` ``{"image": PIL}`` or
``{"video": [frames]}`` on the tiny folders returns HeliosPipeline's / HeliosPyramidPipeline's frames for the same
``image=`` / ``video=`` (same seed and steps, fp32 on the CPU: exactly equal); bad inputs name the field."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from omnistage import Omni
from omnistage.errors import InvalidRequestError
from tests.stages.diffusion.helpers import gen, noise_image, reference_pipeline

PROMPT = "a red cat on a blue chair"
SIZE = dict(height=32, width=32)


def clip(frames: int, seed: int, side: int = 32) -> list[Image.Image]:
    return [noise_image(side, side, seed + i) for i in range(frames)]


def uint8(out) -> np.ndarray:
    return (out.frames[0] * 255).round().astype(np.uint8)


@pytest.fixture(scope="module")
def helios(tiny_model):
    folder = str(tiny_model("helios"))
    with Omni(model=folder) as omni:
        yield omni, reference_pipeline("HeliosPipeline", folder)


def _generate(omni: Omni, mm: dict, **params) -> np.ndarray:
    [out] = omni.generate({"prompt": PROMPT, "multi_modal_data": mm}, [params], use_tqdm=False)
    assert out.error is None, out.error
    return np.asarray(out.video)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,frames",
    [("image", 33), ("image", 34), ("video", 33), ("video", 40)],  # one chunk, two; a video's last whole chunk
)
def test_inputs_equal_the_pipeline(helios, kind, frames):
    omni, ref = helios
    given = noise_image(32, 32, 1) if kind == "image" else clip(frames + 7, 10)
    kw = dict(SIZE, num_frames=frames, num_inference_steps=2)
    got = _generate(omni, {kind: given}, seed=4, negative_prompt="blurry", **kw)
    want = uint8(ref(PROMPT, negative_prompt="blurry", generator=gen(4), output_type="np", **{kind: given}, **kw))
    assert got.shape == want.shape and np.array_equal(got, want)
    # the input counts: without it the same seed makes another video
    plain = uint8(ref(PROMPT, negative_prompt="blurry", generator=gen(4), output_type="np", **kw))
    assert not np.array_equal(plain, want)


@pytest.mark.slow
def test_pyramid_image_to_video_equals_the_pipeline(tiny_model):
    folder = str(tiny_model("helios_pyramid"))
    ref = reference_pipeline("HeliosPyramidPipeline", folder)
    image = noise_image(64, 64, 2)
    kw = dict(height=64, width=64, num_frames=33)
    with Omni(model=folder) as omni:
        got = _generate(omni, {"image": image}, seed=6, num_inference_steps=1, **kw)
    want = uint8(ref(PROMPT, image=image, generator=gen(6), pyramid_num_inference_steps_list=[1, 1, 1], **kw))
    assert got.shape == want.shape == (33, 64, 64, 3) and np.array_equal(got, want)


@pytest.mark.parametrize(
    "mm,field",
    [
        ({"image": noise_image(32, 32, 1), "video": clip(33, 0)}, "multi_modal_data.video"),  # one or the other
        ({"image": [noise_image(32, 32, 1)] * 2}, "multi_modal_data.image"),
        ({"video": clip(32, 0)}, "multi_modal_data.video"),  # under one chunk (33 frames)
        ({"video": [np.zeros((32, 32, 3), np.float32)] * 33}, "multi_modal_data.video[0]"),
    ],
    ids=["image-and-video", "two-images", "short-video", "float-frames"],
)
def test_bad_inputs_name_the_field(helios, mm, field):
    omni, _ = helios
    with pytest.raises(InvalidRequestError) as err:
        omni.generate({"prompt": PROMPT, "multi_modal_data": mm}, [dict(SIZE, num_frames=33)], use_tqdm=False)
    assert err.value.field == field, err.value
