"""Z-Image on the step-batched diffusion engine, through ``AsyncOmni``, checked against diffusers' own
``ZImagePipeline.__call__`` (fp32, CPU, same seed): the family's special cases. Solo-equals-diffusers,
concurrent batching and HTTP are its row in the shared harness (tests/models/image_families.py)."""

from __future__ import annotations

import inspect

import pytest
import torch
from PIL import Image

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import z_image
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final

SMALL = dict(height=32, width=48)  # a 4x6 latent -> 2x3 image tokens
DEPLOY = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent"}]}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.fixture(scope="module")
def folder(tiny_model):
    return str(tiny_model("z_image"))


@pytest.fixture(scope="module")
def ref(folder):
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_folder_resolves_and_knobs_match_the_pipeline(folder):
    from diffusers import ZImagePipeline

    assert resolve_pipeline(folder).name == "z_image"
    sig = inspect.signature(ZImagePipeline.__call__).parameters
    assert z_image.adapter.MAX_SEQUENCE_LENGTH == sig["max_sequence_length"].default
    # the declared extras are the pipeline's own knobs, with its defaults meaning "off"
    assert set(z_image.PIPELINE.extra_body_params) == {"cfg_normalization", "cfg_truncation"}
    assert not sig["cfg_normalization"].default and sig["cfg_truncation"].default == 1.0


async def test_turbo_defaults_equal_diffusers_call(folder, ref):
    """The declared defaults (Z-Image-Turbo: 9 steps, guidance 0) and diffusers' caption length 512."""
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        out = await generate_final(omni, "a bowl of fruit", {**SMALL, "seed": 3, "output_type": "latent"})
    expected = ref(
        "a bowl of fruit", num_inference_steps=9, guidance_scale=0.0, generator=gen(3), output_type="latent", **SMALL
    ).images
    assert max_diff(out.latents, expected) == 0.0


async def test_cfg_knobs_change_the_result(folder):
    """The harness's normalized-truncated row (tests/models/image_families.py) equals diffusers with the knobs;
    here: they are not no-ops, the same request without them gives other latents."""
    params = {**SMALL, "num_inference_steps": 4, "guidance_scale": 3.0, "seed": 11, "output_type": "latent"}
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        knobs = await generate_final(
            omni, "a red cat on a chair", {**params, "extra_args": dict(cfg_normalization=0.5, cfg_truncation=0.5)}
        )
        plain = await generate_final(omni, "a red cat on a chair", params)
    assert not torch.equal(knobs.latents, plain.latents)


@pytest.mark.parametrize(
    "params,images,field",
    [
        (dict(height=40), 0, "height"),  # not a multiple of 16 (VAE 8 x patch 2)
        (dict(width=8), 0, "width"),
        (dict(true_cfg_scale=4.0), 0, "true_cfg_scale"),
        (dict(extra_args={"cfg_truncation": -1.0}), 0, "cfg_truncation"),
        (dict(), 1, "multi_modal_data.image"),  # text-to-image only
    ],
)
async def test_bad_input_names_the_field(folder, params, images, field):
    prompt = {"prompt": "a cat", **({"multi_modal_data": {"image": Image.new("RGB", (32, 32))}} if images else {})}
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        with pytest.raises(InvalidRequestError) as err:
            await generate_final(omni, prompt, {**SMALL, "num_inference_steps": 2, **params})
    assert err.value.field == field
