"""FLUX.1-dev / -schnell on the step-batched diffusion engine, through ``AsyncOmni``, checked against diffusers'
own ``FluxPipeline.__call__`` (fp32, CPU, same seed): the family's special cases. Solo-equals-diffusers,
concurrent batching and HTTP for FLUX.1-dev are its row in the shared harness (tests/models/image_families.py)."""

from __future__ import annotations

import asyncio
import inspect

import pytest
import torch

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import flux
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final
from tests.stages.diffusion.helpers import reference_pipeline, tiny_family

# 32x48 pixels -> a 4x6 latent -> 2x3 packed tokens; a short T5 length keeps the forwards cheap
SMALL = dict(height=32, width=48, max_sequence_length=32)
DEPLOY = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent"}]}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


dev, _, ref = tiny_family("flux", reference="FluxPipeline", folder="dev")


@pytest.fixture(scope="module")
def schnell(tiny_model):
    return str(tiny_model("flux_schnell"))


def test_folders_resolve_to_their_pipelines(dev, schnell, tiny_model):
    assert resolve_pipeline(dev).name == "flux"
    assert resolve_pipeline(schnell).name == "flux_schnell"
    assert resolve_pipeline(str(tiny_model("flux_kontext"))).name == "flux_kontext"


def test_dev_defaults_are_the_pipelines():
    from diffusers import FluxPipeline

    sig = inspect.signature(FluxPipeline.__call__).parameters
    defaults = flux.PIPELINE.stages[0].default_params
    assert defaults["num_inference_steps"] == sig["num_inference_steps"].default
    assert defaults["guidance_scale"] == sig["guidance_scale"].default
    assert flux.adapter.MAX_SEQUENCE_LENGTH == sig["max_sequence_length"].default


async def test_default_t5_length_equals_diffusers_call(dev, ref):
    """The pipeline's own defaults (T5 length 512, guidance 3.5): no parameter but the size and steps."""
    async with AsyncOmni(dev, deploy_config=DEPLOY) as omni:
        out = await generate_final(
            omni,
            "a bowl of fruit",
            {"height": 32, "width": 32, "num_inference_steps": 2, "seed": 5, "output_type": "latent"},
        )
    expected = ref(
        "a bowl of fruit", height=32, width=32, num_inference_steps=2, generator=gen(5), output_type="latent"
    ).images
    assert max_diff(out.latents, expected) == 0.0


async def test_schnell_equals_diffusers_call(schnell):
    ref = reference_pipeline("FluxPipeline", schnell)
    async with AsyncOmni(schnell, deploy_config=DEPLOY) as omni:
        # schnell's declared defaults: 4 steps, T5 length 256, no guidance embedding
        out = await generate_final(
            omni, "a blue chair", {"height": 32, "width": 32, "seed": 2, "output_type": "latent"}
        )
    expected = ref(
        "a blue chair",
        height=32,
        width=32,
        num_inference_steps=4,
        max_sequence_length=256,
        guidance_scale=0.0,
        generator=gen(2),
        output_type="latent",
    ).images
    assert max_diff(out.latents, expected) == 0.0
    assert ref.transformer.config.guidance_embeds is False


async def test_batch_keys_separate_sizes_and_text_lengths(dev):
    """img_ids / txt_ids are one table per forward: other sizes and T5 lengths never share one."""
    kw = dict(num_inference_steps=3, output_type="latent", seed=1)
    variants = [
        dict(height=32, width=48, max_sequence_length=32),
        dict(height=48, width=32, max_sequence_length=32),
        dict(height=32, width=48, max_sequence_length=64),
    ]
    async with AsyncOmni(dev, deploy_config=DEPLOY) as omni:
        solo = [await generate_final(omni, "a red cat", {**kw, **v}) for v in variants]
        engine = omni.replicas(0)[0]
        engine.forward_log.clear()
        together = await asyncio.gather(*(generate_final(omni, "a red cat", {**kw, **v}) for v in variants))
        keys = [key for key, _ in engine.forward_log]
        forwards = [ids for _, ids in engine.forward_log]
    for s, t in zip(solo, together):
        assert max_diff(t.latents, s.latents) <= 1e-5
    assert all(len(ids) == 1 for ids in forwards) and len(set(keys)) == 3


@pytest.mark.parametrize(
    "params,prompt,field",
    [
        (dict(height=40), "a cat", "height"),  # not a multiple of 16 (VAE 8 x 2x2 packing)
        (dict(width=20), "a cat", "width"),
        (dict(max_sequence_length=513), "a cat", "max_sequence_length"),
        (dict(), {"prompt": "a cat", "multi_modal_data": {"image": "__image__"}}, "multi_modal_data.image"),
    ],
)
async def test_bad_input_names_the_field(dev, params, prompt, field):
    from PIL import Image

    if isinstance(prompt, dict):
        prompt = {**prompt, "multi_modal_data": {"image": Image.new("RGB", (32, 32))}}
    async with AsyncOmni(dev, deploy_config=DEPLOY) as omni:
        with pytest.raises(InvalidRequestError) as err:
            await generate_final(omni, prompt, {**SMALL, "num_inference_steps": 2, **params})
    assert err.value.field == field
