"""Offline use of the cosmos3 family: ``Omni`` returns the image, the video and a policy's actions (a float tensor
on the output, with its domain and step rate) equal to Cosmos3OmniPipeline's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage import Omni
from tests.stages.diffusion.helpers import gen, tiny_family

STEPS = dict(num_inference_steps=3, guidance_scale=6.0)

cosmos3, _, ref = tiny_family("cosmos3", reference="Cosmos3OmniPipeline", folder="cosmos3")


def _uint8(frames) -> np.ndarray:
    return (np.asarray(frames) * 255).round().astype(np.uint8)


@pytest.fixture(scope="module")
def omni(cosmos3):
    with Omni(model=cosmos3) as omni:
        yield omni


def test_text_to_video_and_image(omni, ref):
    assert omni.pipeline.name == "cosmos3"
    kw = dict(height=32, width=48, num_frames=9, **STEPS)
    [out] = omni.generate("a red cat", [{**kw, "seed": 2}], use_tqdm=False)
    assert out.modalities == ["video"] and out.fps == 24 and out.actions is None
    assert np.array_equal(out.video, _uint8(ref("a red cat", generator=gen(2), output_type="np", **kw).video))

    kw = dict(height=32, width=32, num_frames=1, **STEPS)
    [out] = omni.generate("a red cat", [{**kw, "seed": 3}], output_modalities=["image"], use_tqdm=False)
    want = _uint8(ref("a red cat", generator=gen(3), output_type="np", **kw).video)[0]
    assert np.array_equal(np.asarray(out.images[0]), want)


def test_policy_returns_actions_as_a_tensor(omni, ref):
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    frame = Image.fromarray(np.random.default_rng(1).integers(0, 255, (32, 48, 3), dtype=np.uint8))
    extra = {"task": "policy", "action_domain": "bridge_orig_lerobot", "action_chunk_size": 4, "resolution_tier": 256}
    prompt = {"prompt": "put the spoon in the pot", "multi_modal_data": {"image": [frame]}}
    [out] = omni.generate(prompt, [{**STEPS, "seed": 4, "fps": 8, "extra_args": extra}], use_tqdm=False)
    cond = CosmosActionCondition(
        mode="policy", chunk_size=4, domain_name="bridge_orig_lerobot", resolution_tier=256, image=frame
    )
    expected = ref("put the spoon in the pot", action=cond, fps=8.0, generator=gen(4), output_type="np", **STEPS)
    assert out.modalities == ["video", "action"]
    assert isinstance(out.actions, torch.Tensor) and out.actions.dtype == torch.float32
    assert out.actions.shape == (4, 10)  # chunk steps x the bridge arm's width (9-D pose + gripper)
    assert torch.equal(out.actions, expected.action[0])
    assert out.action_domain == "bridge_orig_lerobot" and out.action_fps == 8
    assert np.array_equal(out.video, _uint8(expected.video))
