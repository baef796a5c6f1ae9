"""Qwen-Image-2.1 special cases beyond its row in the shared harness (tests/models/image_families.py): the
declared defaults, prompts of different token lengths in flight together (each its own batch key: RoPE puts
the image after the text) still equal diffusers' ``QwenImage21Pipeline.__call__``, edits with condition images
against the same call with the same images, what the deploy refuses,
and bad input naming the field. One engine for the module."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import qwen_image_21
from omnistage.testing.staggered import generate_final
from tests.stages.diffusion.helpers import noise_image

ONE_LOOP = pytest.mark.asyncio(loop_scope="module")
DEPLOY = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent"}]}


@pytest.fixture(scope="module")
def folder(tiny_model):
    return str(tiny_model("qwen_image_21"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(folder):
    engine = await AsyncOmni(folder, deploy_config=DEPLOY).start()
    yield engine
    await engine.shutdown()


def test_defaults_are_the_pipelines():
    from diffusers import QwenImage21Pipeline

    sig = inspect.signature(QwenImage21Pipeline.__call__).parameters
    defaults = qwen_image_21.PIPELINE.stages[0].default_params
    assert defaults == {"num_inference_steps": sig["num_inference_steps"].default}
    assert qwen_image_21.adapter.DEFAULT_TRUE_CFG == sig["true_cfg_scale"].default
    assert qwen_image_21.adapter.DEFAULT_SIZE == sig["output_resolution"].default


@ONE_LOOP
async def test_different_text_lengths_in_flight_equal_diffusers(omni, folder):
    """Two prompts of other token lengths (other batch keys) sent together: each equals diffusers' ``__call__``
    alone (with its default prefix KV cache on; the engine recomputes the prefix every step)."""
    import asyncio

    from diffusers import QwenImage21Pipeline

    ref = QwenImage21Pipeline.from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    kw = dict(height=64, width=64, num_inference_steps=3)
    reqs = [("a red cat on a chair", {}, None), ("mountains at sunset", dict(true_cfg_scale=2.0), "noisy")]
    outs = await asyncio.gather(
        *[
            generate_final(
                omni,
                {"prompt": p, "negative_prompt": n} if n else p,
                {**kw, **extra, "seed": 3, "output_type": "latent"},
            )
            for p, extra, n in reqs
        ]
    )
    for out, (p, extra, n) in zip(outs, reqs):
        want = ref(
            prompt=p, negative_prompt=n, generator=torch.Generator().manual_seed(3), output_type="latent", **kw, **extra
        ).images
        assert (out.latents - want).abs().max().item() == 0.0


@ONE_LOOP
@pytest.mark.parametrize(
    "sizes,size,cfg",
    [
        ([(80, 64)], None, None),  # one image; the output size follows its aspect ratio at output_resolution
        ([(64, 96), (100, 70)], (64, 96), ("blurry", 3.0)),  # two images, an explicit size, true CFG (its own layout)
    ],
    ids=["one-image", "two-images-cfg"],
)
async def test_edit_equals_diffusers_call(omni, folder, sizes, size, cfg):
    from diffusers import QwenImage21Pipeline

    ref = QwenImage21Pipeline.from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    images = [noise_image(h, w, i) for i, (h, w) in enumerate(sizes)]
    kw: dict = dict(num_inference_steps=2)
    if size:
        kw.update(height=size[0], width=size[1])
    if cfg:
        kw.update(true_cfg_scale=cfg[1])
    prompt = {"prompt": "make it red", "multi_modal_data": {"image": images}}
    if cfg:
        prompt["negative_prompt"] = cfg[0]
    params = {**kw, "seed": 5, "extra_args": {"output_resolution": 128}}
    out = await generate_final(omni, prompt, {**params, "output_type": "latent"})
    pics = await generate_final(omni, prompt, params)
    call = dict(
        image=images, prompt="make it red", negative_prompt=cfg[0] if cfg else None, output_resolution=128, **kw
    )
    want = ref(generator=torch.Generator().manual_seed(5), output_type="latent", **call).images
    assert out.latents.shape == want.shape and (out.latents - want).abs().max().item() == 0.0
    want = np.asarray(ref(generator=torch.Generator().manual_seed(5), **call).images[0])
    assert np.array_equal(np.asarray(pics.images[0]), want)
    # the images condition the result: without them the same request gives another image
    h, w = want.shape[:2]
    plain = await generate_final(
        omni,
        {k: v for k, v in prompt.items() if k != "multi_modal_data"},
        {**params, "height": h, "width": w, "output_type": "latent"},
    )
    assert not torch.allclose(plain.latents, out.latents)


async def test_deploy_refuses_what_the_family_cannot_run(folder):
    """At start-up, naming the family and the feature: no Ulysses plan; LoRA is accepted
    (``QwenImage21Pipeline.lora_state_dict``), and so is the step cache (test_step_cache_families.py's row)."""
    from omnistage.engine.builder import resolve_deploy
    from omnistage.pipeline import StageContext
    from omnistage.transport.process_group import check_supported

    pipe = qwen_image_21.PIPELINE
    assert resolve_deploy(pipe, {"stages": [{"stage_id": 0, "enable_lora": True}]}).stage(0).lora_enabled
    deploy = resolve_deploy(
        pipe, {"stages": [{"stage_id": 0, "devices": "0,1", "parallel_config": {"ulysses_degree": 2}}]}
    )
    ctx = StageContext(pipe.stages[0], deploy.stage(0), folder, pipeline_name="qwen_image_21")
    with pytest.raises(ValueError, match=r"ulysses_degree: pipeline 'qwen_image_21' runs \w+, which has no sequence"):
        check_supported(ctx)


@ONE_LOOP
@pytest.mark.parametrize(
    "prompt,params,field",
    [
        ("a cat", dict(height=48), "height"),  # not a multiple of 32 (VAE 16 x 2x2 slots)
        ("a cat", dict(max_sequence_length=64), "max_sequence_length"),  # the whole prompt is encoded
        (
            {"prompt": "a cat", "multi_modal_data": {"image": [noise_image(64, 64, i) for i in range(5)]}},
            {},
            "multi_modal_data.image",
        ),  # more condition images than served
        ("a cat", dict(extra_args=dict(output_resolution=0)), "output_resolution"),
    ],
)
async def test_bad_input_names_the_field(omni, prompt, params, field):
    with pytest.raises(InvalidRequestError) as err:
        await generate_final(omni, prompt, {"height": 64, "width": 64, "num_inference_steps": 1, **params})
    assert err.value.field == field
