"""FLUX.2 [klein] special cases beyond its row in the shared harness (tests/models/image_families.py):
reference-image edits against diffusers' own ``Flux2KleinPipeline.__call__`` with the same images (fp32, CPU,
same seed), the declared defaults, and bad input naming the field."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import flux2
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final
from tests.models.image_families import flux2_unpacked
from tests.stages.diffusion.helpers import noise_image, tiny_family

DEPLOY = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent"}]}


folder, _, ref = tiny_family("flux2_klein", reference="Flux2KleinPipeline")


def test_resolves_and_defaults_are_the_pipelines(folder):
    from diffusers import Flux2KleinPipeline

    assert resolve_pipeline(folder).name == "flux2_klein"
    sig = inspect.signature(Flux2KleinPipeline.__call__).parameters
    defaults = flux2.KLEIN.stages[0].default_params
    assert defaults == {
        "num_inference_steps": sig["num_inference_steps"].default,
        "guidance_scale": sig["guidance_scale"].default,
    }
    assert flux2.adapter.MAX_SEQUENCE_LENGTH == sig["max_sequence_length"].default


@pytest.mark.parametrize(
    "sizes,size,guidance",
    [
        ([(80, 64)], None, 3.0),  # the output size defaults to the reference image's
        ([(64, 96), (100, 70)], (48, 64), 1.0),  # two references (floored to 16 and cropped), an explicit size, no CFG
    ],
    ids=["one-reference", "two-references"],
)
async def test_reference_edit_equals_diffusers_call(folder, ref, sizes, size, guidance):
    images = [noise_image(h, w, i) for i, (h, w) in enumerate(sizes)]
    kw = dict(num_inference_steps=2, guidance_scale=guidance, max_sequence_length=32)
    if size:
        kw.update(height=size[0], width=size[1])
    prompt = {"prompt": "make it red", "multi_modal_data": {"image": images}}
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        out = await generate_final(omni, prompt, {**kw, "seed": 5, "output_type": "latent"})
        pics = await generate_final(omni, prompt, {**kw, "seed": 5})
    h, w = size or sizes[0]
    want = ref(
        image=images, prompt="make it red", generator=torch.Generator().manual_seed(5), output_type="latent", **kw
    ).images
    assert (flux2_unpacked(ref, out.latents, h, w) - want).abs().max().item() <= 2e-6  # see the harness row
    want = ref(image=images, prompt="make it red", generator=torch.Generator().manual_seed(5), **kw).images[0]
    got = np.asarray(pics.images[0])
    assert got.shape == (h, w, 3) and np.abs(got.astype(int) - np.asarray(want).astype(int)).max() <= 1
    # the references condition the result: without them the same request gives another image
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        plain = await generate_final(
            omni, "make it red", {**kw, "height": h, "width": w, "seed": 5, "output_type": "latent"}
        )
    assert not torch.allclose(plain.latents, out.latents)


async def test_negative_prompt_equals_diffusers_negative_embeddings(folder, ref):
    """diffusers' __call__ always encodes "" for CFG and takes other negatives as ``negative_prompt_embeds``; a
    request's ``negative_prompt`` is that (its embeddings by the pipeline's own ``encode_prompt``)."""
    kw = dict(height=32, width=48, num_inference_steps=2, guidance_scale=3.0, max_sequence_length=32)
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        out = await generate_final(
            omni, {"prompt": "a red cat", "negative_prompt": "blurry"}, {**kw, "seed": 2, "output_type": "latent"}
        )
    neg, _ = ref.encode_prompt(prompt="blurry", device="cpu", max_sequence_length=32)
    want = ref(
        prompt="a red cat",
        negative_prompt_embeds=neg,
        generator=torch.Generator().manual_seed(2),
        output_type="latent",
        **kw,
    ).images
    assert (flux2_unpacked(ref, out.latents, 32, 48) - want).abs().max().item() <= 2e-6  # see the harness row


@pytest.mark.parametrize(
    "params,images,field",
    [
        (dict(height=40), 0, "height"),  # not a multiple of 16 (VAE 8 x 2x2 folding)
        (dict(max_sequence_length=600), 0, "max_sequence_length"),
        (dict(true_cfg_scale=3.0), 0, "true_cfg_scale"),  # CFG is guidance_scale
        (dict(strength=0.5), 1, "strength"),  # references condition; they are not noised
        (dict(), 2, "multi_modal_data.image"),  # a reference under diffusers' 64-pixel minimum
    ],
)
async def test_bad_input_names_the_field(folder, params, images, field):
    prompt: dict = {"prompt": "a cat"}
    if images:
        prompt["multi_modal_data"] = {"image": [noise_image(64, 64, 0) if images == 1 else noise_image(32, 32, 0)]}
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        with pytest.raises(InvalidRequestError) as err:
            await generate_final(omni, prompt, {"height": 32, "width": 32, "num_inference_steps": 1, **params})
    assert err.value.field == field
