"""Z-Image on the step-batched diffusion engine, through ``AsyncOmni``, checked against diffusers' own
``ZImagePipeline.__call__`` (fp32, CPU, same seed)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import z_image
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final, solo_then_staggered

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


@pytest.mark.parametrize("case", [
    dict(guidance_scale=0.0),  # Turbo: no CFG
    dict(guidance_scale=0.5),  # CFG runs for any positive scale (not only > 1)
    dict(guidance_scale=4.0, negative_prompt="blurry", num_outputs_per_prompt=2),
    dict(guidance_scale=3.0, extra_args=dict(cfg_normalization=0.5, cfg_truncation=0.5)),  # the cap bites
], ids=["turbo", "small-cfg", "cfg-two-outputs", "normalized-truncated"])
async def test_solo_equals_diffusers_call(folder, ref, case):
    case = dict(case)
    n = case.pop("num_outputs_per_prompt", 1)
    neg = case.pop("negative_prompt", None)
    extra = case.pop("extra_args", {})
    prompt = {"prompt": "a red cat on a chair", **({"negative_prompt": neg} if neg else {})}
    kw = dict(num_inference_steps=4, **SMALL, **case)
    call = dict(kw, negative_prompt=neg, num_images_per_prompt=n, **extra)
    params = {**kw, "seed": 11, "num_outputs_per_prompt": n, "extra_args": extra}
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        out = await generate_final(omni, prompt, {**params, "output_type": "latent"})
        expected = ref(prompt["prompt"], generator=gen(11), output_type="latent", **call).images
        assert out.latents.shape == expected.shape == (n, 4, 4, 6)
        assert max_diff(out.latents, expected) == 0.0
        latents = out.latents
        out = await generate_final(omni, prompt, params)
    expected = ref(prompt["prompt"], generator=gen(11), **call).images
    assert len(out.images) == n
    for got, want in zip(out.images, expected):
        assert np.array_equal(np.asarray(got), np.asarray(want))
    if extra:  # the knobs are not no-ops: without them the same request gives other latents
        plain = ref(prompt["prompt"], generator=gen(11), output_type="latent",
                    **{k: v for k, v in call.items() if k not in extra}).images
        assert not torch.equal(plain, latents)


async def test_turbo_defaults_equal_diffusers_call(folder, ref):
    """The declared defaults (Z-Image-Turbo: 9 steps, guidance 0) and diffusers' caption length 512."""
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        out = await generate_final(omni, "a bowl of fruit", {**SMALL, "seed": 3, "output_type": "latent"})
    expected = ref("a bowl of fruit", num_inference_steps=9, guidance_scale=0.0, generator=gen(3),
                   output_type="latent", **SMALL).images
    assert max_diff(out.latents, expected) == 0.0


async def test_concurrent_requests_match_their_solo_results(folder):
    """Prompts of different token lengths (the transformer masks them), caption limits, seeds, steps, CFG
    scales (incl. none and a truncated, normalized one), each joining the running batch at another step."""
    common = dict(**SMALL, output_type="latent")
    specs = [
        ("a red cat", dict(num_inference_steps=9, seed=1, guidance_scale=0.0)),
        ({"prompt": "a watercolor painting of mountains at sunset, high detail", "negative_prompt": "blurry"},
         dict(num_inference_steps=7, seed=2, guidance_scale=4.0)),
        ("green square", dict(num_inference_steps=5, seed=3, guidance_scale=2.0, num_outputs_per_prompt=2,
                              max_sequence_length=24)),
        ("city skyline at night with neon lights", dict(num_inference_steps=6, seed=4, guidance_scale=3.0,
                                                        extra_args=dict(cfg_normalization=1.2,
                                                                        cfg_truncation=0.6))),
    ]
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        solo, together, forwards = await solo_then_staggered(omni, [(p, {**common, **kw}) for p, kw in specs])
    for i, (s, t) in enumerate(zip(solo, together)):
        assert s.latents.shape == t.latents.shape
        assert max_diff(t.latents, s.latents) <= 1e-5, i
    assert len(forwards[0]) == 1 and max(len(ids) for ids in forwards) == 4


@pytest.mark.parametrize("params,images,field", [
    (dict(height=40), 0, "height"),  # not a multiple of 16 (VAE 8 x patch 2)
    (dict(width=8), 0, "width"),
    (dict(true_cfg_scale=4.0), 0, "true_cfg_scale"),
    (dict(extra_args={"cfg_truncation": -1.0}), 0, "cfg_truncation"),
    (dict(), 1, "multi_modal_data.image"),  # text-to-image only
])
async def test_bad_input_names_the_field(folder, params, images, field):
    prompt = {"prompt": "a cat", **({"multi_modal_data": {"image": Image.new("RGB", (32, 32))}} if images else {})}
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        with pytest.raises(InvalidRequestError) as err:
            await generate_final(omni, prompt, {**SMALL, "num_inference_steps": 2, **params})
    assert err.value.field == field
