"""Qwen-Image-Edit (one input image) and -Edit-2509/-2511 (1-3 input images) on the step-batched diffusion
engine, through ``AsyncOmni``, checked against diffusers' own ``QwenImageEditPipeline.__call__`` and
``QwenImageEditPlusPipeline.__call__`` (fp32, CPU, same seed).

The pipelines resize every input image to ~1024x1024 px for the VAE whatever the output size, so each
input image costs a VAE encode of a megapixel (about a second here) and 1024 sequence tokens."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.testing.staggered import generate_final, solo_then_staggered

from .common import DEPLOY, gen, image, max_diff, reference

SMALL = dict(height=64, width=64)  # x16 VAE, 2x2 packing: 4 output tokens (+1024 per input image)


def edit(prompt: str, images, negative: str | None = None) -> dict:
    return {
        "prompt": prompt,
        "multi_modal_data": {"image": images},
        **({"negative_prompt": negative} if negative is not None else {}),
    }


@pytest.fixture(scope="module")
def one(tiny_model):
    return str(tiny_model("qwen_image_edit"))


@pytest.fixture(scope="module")
def plus(tiny_model):
    return str(tiny_model("qwen_image_edit_plus"))


@pytest.fixture(scope="module")
def ref_one(one):
    return reference("QwenImageEditPipeline", one)


@pytest.fixture(scope="module")
def ref_plus(plus):
    return reference("QwenImageEditPlusPipeline", plus)


async def test_edit_equals_diffusers_call(one, ref_one):
    """True CFG with a negative prompt, two outputs per prompt: latents and decoded images."""
    src = image(40, 60)
    kw = dict(num_inference_steps=3, true_cfg_scale=3.0, **SMALL)
    call = dict(kw, negative_prompt="blurry", num_images_per_prompt=2)
    params = {**kw, "seed": 7, "num_outputs_per_prompt": 2}
    async with AsyncOmni(one, deploy_config=DEPLOY) as omni:
        out = await generate_final(omni, edit("make the cat green", src, "blurry"), {**params, "output_type": "latent"})
        expected = ref_one(
            image=src, prompt="make the cat green", generator=gen(7), output_type="latent", **call
        ).images
        assert out.latents.shape == expected.shape == (2, 4, 64)
        assert max_diff(out.latents, expected) == 0.0
        latents = out.latents
        out = await generate_final(omni, edit("make the cat green", src, "blurry"), params)
        expected = ref_one(image=src, prompt="make the cat green", generator=gen(7), **call).images
        assert len(out.images) == 2
        for got, want in zip(out.images, expected):
            assert got.size == (64, 64)
            assert np.array_equal(np.asarray(got), np.asarray(want))
        # the image conditions the result: another input image (same size) gives another output
        other = await generate_final(
            omni, edit("make the cat green", image(40, 60, seed=1), "blurry"), {**params, "output_type": "latent"}
        )
        assert not torch.equal(other.latents, latents)


@pytest.mark.slow
@pytest.mark.parametrize("count", [1, 2, 3])
async def test_edit_plus_equals_diffusers_call(plus, ref_plus, count):
    """1, 2 and 3 input images of different sizes (the output defaults to the last one's ~1 Mpx size in
    diffusers; the test asks for 64x64), true CFG on, the -2511 zero_cond_t transformer."""
    srcs = [image(40, 60, 1), image(50, 30, 2), image(36, 36, 3)][:count]
    kw = dict(num_inference_steps=2, true_cfg_scale=2.5, **SMALL)
    async with AsyncOmni(plus, deploy_config=DEPLOY) as omni:
        out = await generate_final(
            omni, edit("put them on a beach", srcs, " "), {**kw, "seed": 4, "output_type": "latent"}
        )
    expected = ref_plus(
        image=srcs, prompt="put them on a beach", negative_prompt=" ", generator=gen(4), output_type="latent", **kw
    ).images
    assert out.latents.shape == expected.shape == (1, 4, 64)
    assert max_diff(out.latents, expected) == 0.0


@pytest.mark.slow
async def test_edit_plus_image_equals_diffusers_call(plus, ref_plus):
    srcs = [image(40, 60, 1), image(50, 30, 2)]
    kw = dict(num_inference_steps=2, **SMALL)
    async with AsyncOmni(plus, deploy_config=DEPLOY) as omni:
        out = await generate_final(
            omni, edit("a cat and a chair", srcs), {**kw, "seed": 5, "num_outputs_per_prompt": 2}
        )
    expected = ref_plus(image=srcs, prompt="a cat and a chair", generator=gen(5), num_images_per_prompt=2, **kw).images
    assert len(out.images) == 2
    for got, want in zip(out.images, expected):
        assert np.array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.slow
async def test_concurrent_edits_match_their_solo_results(plus):
    """Edits whose input images have the same sizes, with different prompts, images, seeds, steps and true-CFG
    scales, join one batch at different steps; an edit with another input-image size never shares their
    forwards (its image tokens and RoPE grids differ). The first three run long enough (20/16/12 steps) that the
    fourth, joining some forwards after the third's first step (more under load), still finds them all running."""
    common = dict(**SMALL, output_type="latent")
    specs = [
        (edit("make it red", [image(40, 60, 1)]), dict(num_inference_steps=20, seed=1)),
        (
            edit("make it blue and shiny", [image(40, 60, 2)], "blurry"),
            dict(num_inference_steps=16, seed=2, true_cfg_scale=3.0),
        ),
        (edit("add a hat", [image(40, 60, 3)]), dict(num_inference_steps=12, seed=3, num_outputs_per_prompt=2)),
        (
            edit("night time", [image(40, 60, 4)], "day, sun, bright colors"),
            dict(num_inference_steps=4, seed=4, true_cfg_scale=2.0),
        ),
    ]
    async with AsyncOmni(plus, deploy_config=DEPLOY) as omni:
        solo, together, forwards = await solo_then_staggered(omni, [(p, {**common, **kw}) for p, kw in specs])
        for i, (s, t) in enumerate(zip(solo, together)):
            assert max_diff(t.latents, s.latents) <= 1e-5, i
        assert len(forwards[0]) == 1 and max(len(ids) for ids in forwards) == 4

        kw = dict(common, num_inference_steps=2, seed=5)
        wide, tall = edit("a cat", [image(40, 60, 5)]), edit("a cat", [image(60, 40, 5)])
        alone = [await generate_final(omni, p, kw) for p in (wide, tall)]
        engine = omni.replicas(0)[0]
        engine.forward_log.clear()
        both = await asyncio.gather(*(generate_final(omni, p, kw) for p in (wide, tall)))
        assert all(len(ids) == 1 for _, ids in engine.forward_log)
        assert len({key for key, _ in engine.forward_log}) == 2
        for a, b in zip(alone, both):
            assert max_diff(b.latents, a.latents) <= 1e-5


@pytest.mark.parametrize(
    "folder,images,params,field",
    [
        ("one", 2, dict(), "multi_modal_data.image"),  # Qwen-Image-Edit takes one image
        ("plus", 4, dict(), "multi_modal_data.image"),  # -2509/-2511: 1-3 images
        ("plus", 0, dict(), "multi_modal_data.image"),  # an edit checkpoint needs an input image
        ("plus", 1, dict(height=48), "height"),  # not a multiple of 32 (x16 VAE x 2x2 packing)
        ("one", 1, dict(strength=0.5), "strength"),
    ],
)
async def test_bad_input_names_the_field(request, folder, images, params, field):
    prompt = edit("a cat", [image(32, 32, i) for i in range(images)]) if images else "a cat"
    async with AsyncOmni(request.getfixturevalue(folder), deploy_config=DEPLOY) as omni:
        with pytest.raises(InvalidRequestError) as err:
            await generate_final(omni, prompt, {**SMALL, "num_inference_steps": 2, **params})
    assert err.value.field == field
