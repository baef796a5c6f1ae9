"""PixArt-Σ and Sana (whose adapter is PixArt-Σ's with Sana's differences): the special cases beyond their
rows in the shared harness (tests/models/image_families.py), against diffusers' own ``__call__`` (fp32, CPU).
Resolution binning, on by default, serves a request from the nearest trained bin and resizes back."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import pixart_sigma, sana
from omnistage.testing.staggered import generate_final

DEPLOY = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent"}]}
FAMILIES = {"pixart_sigma": ("PixArtSigmaPipeline", pixart_sigma), "sana": ("SanaPipeline", sana)}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tiny_model):
    import diffusers

    cls, module = FAMILIES[request.param]
    folder = str(tiny_model(request.param))
    ref = getattr(diffusers, cls).from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    return request.param, folder, ref, module


def test_defaults_are_the_pipelines(family):
    _, _, ref, module = family
    sig = inspect.signature(type(ref).__call__).parameters
    defaults = module.PIPELINE.stages[0].default_params
    assert defaults["num_inference_steps"] == sig["num_inference_steps"].default
    assert defaults["guidance_scale"] == sig["guidance_scale"].default
    assert sig["max_sequence_length"].default == 300 and sig["use_resolution_binning"].default is True
    assert module.PIPELINE.extra_body_params == {"use_resolution_binning": bool}


async def test_resolution_binning_equals_diffusers_call(family):
    """A size off the bins (40x56): generated at the nearest bin, the images resized and cropped back."""
    _, folder, ref, _ = family
    kw = dict(height=40, width=56, num_inference_steps=2, guidance_scale=4.0)
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        out = await generate_final(omni, "a red cat", {**kw, "seed": 4, "output_type": "latent"})
        images = await generate_final(omni, "a red cat", {**kw, "seed": 4, "num_outputs_per_prompt": 2})
    expected = ref("a red cat", generator=gen(4), output_type="latent", **kw).images
    assert out.latents.shape == expected.shape and expected.shape[2:] != (40 // 8, 56 // 8)  # the bin's size
    assert (out.latents - expected).abs().max().item() == 0.0
    want = ref("a red cat", generator=gen(4), num_images_per_prompt=2, **kw).images
    assert len(images.images) == 2
    for got, w in zip(images.images, want):
        assert got.size == (56, 40)
        assert np.array_equal(np.asarray(got), np.asarray(w))


@pytest.mark.parametrize(
    "params,images,field",
    [
        (
            dict(height=40, extra_args={"use_resolution_binning": False}),
            0,
            "height",
        ),  # not a multiple of the patch grid
        (dict(true_cfg_scale=3.0), 0, "true_cfg_scale"),  # CFG is guidance_scale
        (dict(max_sequence_length=600), 0, "max_sequence_length"),
        (dict(extra_args={"use_resolution_binning": "maybe"}), 0, "use_resolution_binning"),
        (dict(), 1, "multi_modal_data.image"),  # text-to-image only
    ],
)
async def test_bad_input_names_the_field(family, params, images, field):
    _, folder, _, _ = family
    prompt = {"prompt": "a cat", **({"multi_modal_data": {"image": Image.new("RGB", (32, 32))}} if images else {})}
    async with AsyncOmni(folder, deploy_config=DEPLOY) as omni:
        with pytest.raises(InvalidRequestError) as err:
            await generate_final(omni, prompt, {"height": 64, "width": 64, "num_inference_steps": 2, **params})
    assert err.value.field == field


def test_deploy_refuses_what_the_family_cannot_run(tiny_model):
    """At start-up, naming the family and the feature: PixArt-Σ has no diffusers LoRA loader (Sana has one:
    tests/models/test_image_families_lora.py); neither transformer has a sequence-parallel (Ulysses) plan."""
    from omnistage.config import ConfigError
    from omnistage.engine.builder import resolve_deploy
    from omnistage.pipeline import StageContext
    from omnistage.transport.process_group import check_supported

    with pytest.raises(ConfigError, match=r"stages\[0\]\.lora_modules: pipeline 'pixart_sigma' does not support LoRA"):
        resolve_deploy(pixart_sigma.PIPELINE, {"stages": [{"stage_id": 0, "enable_lora": True}]})
    assert resolve_deploy(sana.PIPELINE, {"stages": [{"stage_id": 0, "enable_lora": True}]}).stage(0).lora_enabled
    for name, module in (("pixart_sigma", pixart_sigma), ("sana", sana)):
        deploy = resolve_deploy(
            module.PIPELINE, {"stages": [{"stage_id": 0, "devices": "0,1", "parallel_config": {"ulysses_degree": 2}}]}
        )
        ctx = StageContext(module.PIPELINE.stages[0], deploy.stage(0), str(tiny_model(name)), pipeline_name=name)
        with pytest.raises(ValueError, match=rf"ulysses_degree: pipeline '{name}' runs \w+, which has no sequence"):
            check_supported(ctx)
