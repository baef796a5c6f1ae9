"""Cosmos3's conditioned tasks on the diffusion engine against diffusers' Cosmos3OmniPipeline (fp32, CPU): image ->
video, video -> video, and the world model's action tasks (policy, forward and inverse dynamics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.errors import InvalidRequestError
from omnistage.models.cosmos3 import PIPELINE, Cosmos3Adapter
from omnistage.stages.base import StageRequest
from tests.stages.diffusion.helpers import finished_data, gen, run, solo_then_staggered, tiny_family
from tests.stages.diffusion.helpers import start_engine as _start

STEPS = dict(num_inference_steps=3, guidance_scale=6.0)
# the smallest resolution tier: a small first frame is padded into its 256x256 canvas, not upscaled
ACTION = dict(action_domain="av", action_chunk_size=4, resolution_tier=256)


cosmos3, adapter, ref = tiny_family("cosmos3", Cosmos3Adapter, "Cosmos3OmniPipeline", folder="cosmos3")


@pytest.fixture
async def engine(cosmos3, adapter):
    engine = await _start(PIPELINE, adapter, cosmos3)
    yield engine
    await engine.shutdown()


def _frame(seed: int, h: int = 32, w: int = 48) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def _clip(seed: int, n: int = 5) -> list[np.ndarray]:
    return [np.asarray(_frame(seed + i)) for i in range(n)]


def _uint8(frames) -> np.ndarray:
    return (np.asarray(frames) * 255).round().astype(np.uint8)


def _condition(task: str, **kw):
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    return CosmosActionCondition(
        mode=task, chunk_size=ACTION["action_chunk_size"], domain_name="av", resolution_tier=256, **kw
    )


async def test_image_to_video_equals_diffusers(engine, ref):
    kw = dict(height=32, width=48, num_frames=9, **STEPS)
    inputs = {"multi_modal_data": {"image": [_frame(1)]}}
    data = finished_data(await run(engine, "a", "a boat", inputs=inputs, seed=3, **kw))
    expected = ref("a boat", image=_frame(1), generator=gen(3), output_type="np", **kw).video
    assert np.array_equal(data["video"], _uint8(expected))


async def test_video_to_video_equals_diffusers(engine, ref):
    kw = dict(height=32, width=48, num_frames=9, **STEPS)
    inputs = {"multi_modal_data": {"video": _clip(2)}}
    data = finished_data(await run(engine, "a", "a boat", inputs=inputs, seed=4, **kw))
    expected = ref("a boat", video=_clip(2), generator=gen(4), output_type="np", **kw).video
    assert np.array_equal(data["video"], _uint8(expected))


async def test_policy_makes_video_and_actions_equal_to_diffusers(engine, ref):
    inputs = {"multi_modal_data": {"image": [_frame(5)]}}
    outs = await run(engine, "a", "pick up the cup", inputs=inputs, seed=6, extra_args={"task": "policy", **ACTION},
                     **STEPS)  # fmt: skip
    data = finished_data(outs)
    expected = ref("pick up the cup", action=_condition("policy", image=_frame(5)), generator=gen(6),
                   output_type="np", **STEPS)  # fmt: skip
    assert np.array_equal(data["video"], _uint8(expected.video))
    assert data["action"].shape == (4, 9)  # chunk steps x the av domain's width
    assert torch.equal(data["action"], expected.action[0])
    assert data["action_domain"] == "av" and data["action_fps"] == 24.0


async def test_forward_dynamics_rolls_out_given_actions_like_diffusers(engine, ref):
    actions = torch.randn(4, 9, generator=gen(0))
    inputs = {"multi_modal_data": {"image": [_frame(7)]}}
    extra = {"task": "forward_dynamics", "actions": actions.tolist(), **ACTION}
    data = finished_data(await run(engine, "a", "drive on", inputs=inputs, seed=8, extra_args=extra, **STEPS))
    cond = _condition("forward_dynamics", image=_frame(7), raw_actions=torch.tensor(actions.tolist()))
    expected = ref("drive on", action=cond, generator=gen(8), output_type="np", **STEPS)
    assert np.array_equal(data["video"], _uint8(expected.video))
    assert "action" not in data and expected.action is None  # the actions were given, not predicted


async def test_inverse_dynamics_infers_actions_like_diffusers(engine, ref):
    inputs = {"multi_modal_data": {"video": _clip(9)}}
    extra = {"task": "inverse_dynamics", **ACTION}
    data = finished_data(await run(engine, "a", "what moved", inputs=inputs, seed=10, extra_args=extra, **STEPS))
    expected = ref("what moved", action=_condition("inverse_dynamics", video=_clip(9)), generator=gen(10),
                   output_type="np", **STEPS)  # fmt: skip
    assert torch.equal(data["action"], expected.action[0])
    assert np.array_equal(data["video"], _uint8(expected.video))


async def test_mixed_tasks_concurrent_equal_solo(engine):
    """A text-to-video, a policy and an image-to-video request at once: each equals its solo run exactly."""
    image = {"multi_modal_data": {"image": [_frame(11)]}}
    specs = [
        ("t2v", "a red cat", dict(seed=1, height=32, width=48, num_frames=9, num_inference_steps=5)),
        ("policy", "pick", dict(seed=2, inputs=image, extra_args={"task": "policy", **ACTION}, num_inference_steps=4)),
        ("i2v", "a boat", dict(seed=3, inputs=image, height=32, width=48, num_frames=9, num_inference_steps=4)),
    ]
    solo, together, _ = await solo_then_staggered(engine, specs, output_type="latent", guidance_scale=6.0)
    for (rid, _, _), got in zip(specs, together):
        assert torch.equal(got, solo[rid]), rid


@pytest.mark.parametrize(
    "extra, inputs, field",
    [
        ({"task": "dance"}, "image", "task"),
        ({"task": "policy"}, None, "multi_modal_data.image"),
        ({"task": "inverse_dynamics"}, "image", "multi_modal_data.video"),
        ({"task": "policy", "action_domain": "mars"}, "image", "action_domain"),
        ({"task": "forward_dynamics", "actions": [[0.0] * 7] * 4}, "image", "actions"),  # av actions are 9 wide
        ({"task": "forward_dynamics"}, "image", "actions"),
        ({"task": "policy", "actions": [[0.0] * 9]}, "image", "actions"),
        ({"task": "policy", "action_chunk_size": 0}, "image", "action_chunk_size"),
        ({"task": "policy", "resolution_tier": 300}, "image", "resolution_tier"),
        ({"action_domain": "av"}, None, "action_domain"),  # action parameters without an action task
    ],
)
async def test_bad_action_requests_name_the_field(engine, extra, inputs, field):
    mm = {"multi_modal_data": {"image": [_frame(0)]}} if inputs == "image" else {}
    extra = {**ACTION, **extra} if "task" in extra else extra
    params = {"num_inference_steps": 2, "extra_args": extra}
    with pytest.raises(InvalidRequestError) as e:
        async for _ in engine.generate(StageRequest("bad", {"prompt": "x", **mm}, params)):
            pass
    assert e.value.field == field, e.value.message
