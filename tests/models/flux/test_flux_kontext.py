"""FLUX.1-Kontext edits on the step-batched diffusion engine, through ``AsyncOmni``, checked against diffusers'
own ``FluxKontextPipeline.__call__`` (fp32, CPU, same seed)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.testing.staggered import generate_final, solo_then_staggered
from tests.stages.diffusion.helpers import tiny_family

from .test_flux import DEPLOY, gen, max_diff

# keep the requested 32x48 output (max_area = its area) and the input image's own size (no resize to a
# ~1 Mpx Kontext training resolution): a few tokens per forward
SMALL = dict(height=32, width=48, max_sequence_length=32, guidance_scale=2.5)
KEEP = {"max_area": 32 * 48, "auto_resize": False}


def image(h: int, w: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def edit(prompt: str, im: Image.Image, negative: str | None = None) -> dict:
    return {"prompt": prompt, "multi_modal_data": {"image": im}, **({"negative_prompt": negative} if negative else {})}


kontext, _, ref = tiny_family("flux_kontext", reference="FluxKontextPipeline", folder="kontext")


@pytest.mark.parametrize(
    "case",
    [dict(), dict(true_cfg_scale=3.0, negative_prompt="blurry"), dict(num_outputs_per_prompt=2)],
    ids=["edit", "true-cfg", "two-outputs"],
)
async def test_edit_equals_diffusers_call(kontext, ref, case):
    case = dict(case)
    n = case.pop("num_outputs_per_prompt", 1)
    neg = case.pop("negative_prompt", None)
    src = image(48, 32)
    kw = dict(num_inference_steps=4, **SMALL, **case)
    call = dict(kw, negative_prompt=neg, num_images_per_prompt=n, max_area=KEEP["max_area"], _auto_resize=False)
    async with AsyncOmni(kontext, deploy_config=DEPLOY) as omni:
        params = {**kw, "seed": 7, "num_outputs_per_prompt": n, "extra_args": KEEP}
        out = await generate_final(omni, edit("make it red", src, neg), {**params, "output_type": "latent"})
        expected = ref(image=src, prompt="make it red", generator=gen(7), output_type="latent", **call).images
        assert out.latents.shape == expected.shape == (n, 6, 16)
        assert max_diff(out.latents, expected) == 0.0
        latents = out.latents
        out = await generate_final(omni, edit("make it red", src, neg), params)
        expected = ref(image=src, prompt="make it red", generator=gen(7), **call).images
        assert len(out.images) == n
        for got, want in zip(out.images, expected):
            assert np.array_equal(np.asarray(got), np.asarray(want))
        # the image conditions the result: another input image gives another output
        other = await generate_final(
            omni, edit("make it red", image(48, 32, seed=1), neg), {**params, "output_type": "latent"}
        )
        assert not torch.equal(other.latents, latents)


@pytest.mark.slow
async def test_default_resize_and_area_equal_diffusers_call(kontext, ref):
    """diffusers' defaults: the input image resized to the Kontext resolution nearest its aspect ratio
    (1024-ish pixels a side: 4096 image tokens here) and a 1 Mpx output area, scaled down by max_area only."""
    src = image(60, 90)
    async with AsyncOmni(kontext, deploy_config=DEPLOY) as omni:
        out = await generate_final(
            omni,
            edit("a cat", src),
            dict(num_inference_steps=2, **SMALL, seed=3, output_type="latent", extra_args={"max_area": 32 * 48}),
        )
    expected = ref(
        image=src,
        prompt="a cat",
        num_inference_steps=2,
        max_area=32 * 48,
        generator=gen(3),
        output_type="latent",
        **SMALL,
    ).images
    assert max_diff(out.latents, expected) == 0.0


async def test_text_to_image_without_an_image_equals_diffusers_call(kontext, ref):
    async with AsyncOmni(kontext, deploy_config=DEPLOY) as omni:
        out = await generate_final(
            omni, "a bowl of fruit", dict(num_inference_steps=3, **SMALL, seed=4, output_type="latent", extra_args=KEEP)
        )
    expected = ref(
        prompt="a bowl of fruit",
        num_inference_steps=3,
        generator=gen(4),
        output_type="latent",
        max_area=KEEP["max_area"],
        **SMALL,
    ).images
    assert max_diff(out.latents, expected) == 0.0


async def test_concurrent_edits_match_their_solo_results(kontext):
    """Edits of same-size input images with different prompts, seeds, steps, guidance and true CFG join one
    batch at different steps; an edit of another input size never shares their forwards. Each request joins about
    two forwards after the previous one's first step (it is encoded meanwhile), more under load: the first three run
    long enough (24/20/16 steps) that the fourth still finds them all running (8/6/5 once missed by one forward)."""
    common = dict(**SMALL, output_type="latent", extra_args=KEEP)
    common.pop("guidance_scale")
    specs = [
        (edit("make it red", image(48, 32, 1)), dict(num_inference_steps=24, seed=1, guidance_scale=2.5)),
        (
            edit("make it blue", image(48, 32, 2), "blurry"),
            dict(num_inference_steps=20, seed=2, guidance_scale=3.5, true_cfg_scale=2.0),
        ),
        (
            edit("add a hat", image(48, 32, 3)),
            dict(num_inference_steps=16, seed=3, guidance_scale=1.5, num_outputs_per_prompt=2),
        ),
        (edit("night time", image(48, 32, 4)), dict(num_inference_steps=7, seed=4, guidance_scale=4.0)),
    ]
    async with AsyncOmni(kontext, deploy_config=DEPLOY) as omni:
        solo, together, forwards = await solo_then_staggered(omni, [(p, {**common, **kw}) for p, kw in specs])
        for i, (s, t) in enumerate(zip(solo, together)):
            assert max_diff(t.latents, s.latents) <= 1e-5, i
        assert len(forwards[0]) == 1 and max(len(ids) for ids in forwards) == 4

        # another input-image size: its own key (its image tokens change the sequence)
        kw = dict(common, num_inference_steps=3, guidance_scale=2.5, seed=5)
        small, tall = edit("a cat", image(48, 32, 5)), edit("a cat", image(64, 32, 5))
        alone = [await generate_final(omni, p, kw) for p in (small, tall)]
        engine = omni.replicas(0)[0]
        engine.forward_log.clear()
        both = await asyncio.gather(*(generate_final(omni, p, kw) for p in (small, tall)))
        assert all(len(ids) == 1 for _, ids in engine.forward_log)
        assert len({key for key, _ in engine.forward_log}) == 2
        for a, b in zip(alone, both):
            assert max_diff(b.latents, a.latents) <= 1e-5


@pytest.mark.parametrize(
    "params,images,field",
    [
        (dict(), 2, "multi_modal_data.image"),  # Kontext edits one image
        (dict(height=36), 1, "height"),
        (dict(strength=0.5), 1, "strength"),
        (dict(extra_args={"max_area": 0}), 1, "max_area"),
        (dict(extra_args={"auto_resize": "sometimes"}), 1, "auto_resize"),
    ],
)
async def test_bad_input_names_the_field(kontext, params, images, field):
    prompt = {"prompt": "a cat", "multi_modal_data": {"image": [image(32, 32, i) for i in range(images)]}}
    async with AsyncOmni(kontext, deploy_config=DEPLOY) as omni:
        with pytest.raises(InvalidRequestError) as err:
            await generate_final(omni, prompt, {**SMALL, "num_inference_steps": 2, **params})
    assert err.value.field == field
