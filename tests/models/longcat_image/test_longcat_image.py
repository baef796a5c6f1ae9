"""LongCat-Image special cases beyond its row in the shared harness (tests/models/image_families.py): edits with
``LongCatImageEditPipeline.__call__`` as the reference (fp32, CPU, same seed and image) alone and concurrent,
prompt rewriting against diffusers' own, the declared defaults, bad input naming the field, and what the
deploy schema refuses at start-up."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import pytest_asyncio
import torch
from PIL import Image

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import longcat_image
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final, solo_then_staggered
from tests.stages.diffusion.helpers import noise_image, tiny_family

ONE_LOOP = pytest.mark.asyncio(loop_scope="module")
DEPLOY = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent"}]}


folder, _, ref = tiny_family("longcat_image_edit", reference="LongCatImageEditPipeline")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(folder):
    async with AsyncOmni(folder, deploy_config=DEPLOY) as engine:
        yield engine


def edit(prompt: str, im: Image.Image, negative: str | None = None) -> dict:
    out = {"prompt": prompt, "multi_modal_data": {"image": [im]}}
    return out if negative is None else {**out, "negative_prompt": negative}


def test_resolves_and_defaults_are_the_pipelines(folder, tiny_model):
    import diffusers

    assert resolve_pipeline(folder).name == "longcat_image_edit"
    assert resolve_pipeline(tiny_model("longcat_image")).name == "longcat_image"
    for pipeline, cls in (
        (longcat_image.PIPELINE, diffusers.LongCatImagePipeline),
        (longcat_image.EDIT, diffusers.LongCatImageEditPipeline),
    ):
        sig = inspect.signature(cls.__call__).parameters
        assert pipeline.stages[0].default_params == {
            "num_inference_steps": sig["num_inference_steps"].default,
            "guidance_scale": sig["guidance_scale"].default,
        }
    sig = inspect.signature(diffusers.LongCatImagePipeline.__call__).parameters
    assert sig["enable_cfg_renorm"].default is True and sig["cfg_renorm_min"].default == 0.0


@ONE_LOOP
@pytest.mark.parametrize(
    "size,kw,negative",
    [
        ((64, 64), dict(num_inference_steps=2, guidance_scale=4.5), "blurry"),  # square: 1024x1024 out, CFG
        ((60, 80), dict(num_inference_steps=2, guidance_scale=1.0, num_outputs_per_prompt=2), None),  # 4:3, no CFG
    ],
    ids=["square-cfg-negative", "landscape-two-outputs"],
)
async def test_edit_equals_diffusers_call(omni, ref, size, kw, negative):
    im = noise_image(*size, seed=1)
    n = kw.pop("num_outputs_per_prompt", 1)
    params = {**kw, "num_outputs_per_prompt": n, "seed": 5}
    out = await generate_final(omni, edit("make it red", im, negative), {**params, "output_type": "latent"})
    pics = await generate_final(omni, edit("make it red", im, negative), params)
    extra = {} if negative is None else {"negative_prompt": negative}
    want = ref(
        image=im,
        prompt="make it red",
        num_images_per_prompt=n,
        generator=torch.Generator().manual_seed(5),
        output_type="latent",
        **kw,
        **extra,
    ).images
    assert out.latents.shape == want.shape and (out.latents - want).abs().max().item() == 0.0
    want = ref(
        image=im,
        prompt="make it red",
        num_images_per_prompt=n,
        generator=torch.Generator().manual_seed(5),
        **kw,
        **extra,
    ).images
    assert len(pics.images) == n
    for got, w in zip(pics.images, want):
        assert np.array_equal(np.asarray(got), np.asarray(w))


@ONE_LOOP
async def test_concurrent_edits_match_their_solo_results(omni):
    specs = [
        (edit("make it red", noise_image(64, 64, 1)), dict(num_inference_steps=5, guidance_scale=4.5, seed=1)),
        (edit("add a hat", noise_image(64, 64, 2), "blurry"), dict(num_inference_steps=4, guidance_scale=2.0, seed=2)),
        (
            edit("make the cat green", noise_image(48, 48, 3)),
            dict(num_inference_steps=3, guidance_scale=1.0, seed=3, num_outputs_per_prompt=2),
        ),
    ]
    specs = [(p, {**kw, "output_type": "latent"}) for p, kw in specs]
    solo, together, forwards = await solo_then_staggered(omni, specs)
    for i, (s, t) in enumerate(zip(solo, together)):
        assert (t.latents - s.latents).abs().max().item() <= 1e-5, i
    assert len(forwards[0]) == 1 and max(len(ids) for ids in forwards) >= 2
    assert not torch.equal(together[0].latents, together[1].latents)


@pytest.mark.slow  # a 512-token generation, twice
async def test_prompt_rewrite_equals_diffusers(tiny_model):
    """``enable_prompt_rewrite``: the text encoder's own generation rewrites the prompt first, as diffusers'."""
    from diffusers import LongCatImagePipeline

    t2i = str(tiny_model("longcat_image"))
    kw = dict(height=32, width=32, num_inference_steps=2, guidance_scale=3.0)
    async with AsyncOmni(t2i, deploy_config=DEPLOY) as engine:
        out = await generate_final(
            engine,
            "a red cat",
            {**kw, "seed": 2, "output_type": "latent", "extra_args": {"enable_prompt_rewrite": True}},
        )
        plain = await generate_final(engine, "a red cat", {**kw, "seed": 2, "output_type": "latent"})
    pipe = LongCatImagePipeline.from_pretrained(t2i)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(
        prompt="a red cat",
        generator=torch.Generator().manual_seed(2),
        output_type="latent",
        enable_prompt_rewrite=True,
        **kw,
    ).images
    assert (out.latents - want).abs().max().item() == 0.0
    assert not torch.equal(out.latents, plain.latents)  # the rewrite changed the conditioning


@ONE_LOOP
@pytest.mark.parametrize(
    "params,images,field",
    [
        (dict(), 0, "multi_modal_data.image"),  # an edit needs its image
        (dict(), 2, "multi_modal_data.image"),  # ... exactly one
        (dict(height=512), 1, "height"),  # the size follows the image (1024x1024 for a square one)
        (dict(max_sequence_length=64), 1, "max_sequence_length"),  # fixed at 512
        (dict(strength=0.5), 1, "strength"),
        (dict(true_cfg_scale=2.0), 1, "true_cfg_scale"),
    ],
)
async def test_bad_edit_input_names_the_field(omni, params, images, field):
    prompt: dict = {"prompt": "a cat"}
    if images:
        prompt["multi_modal_data"] = {"image": [noise_image(32, 32, i) for i in range(images)]}
    with pytest.raises(InvalidRequestError) as err:
        await generate_final(omni, prompt, {"num_inference_steps": 1, **params})
    assert err.value.field == field


@pytest.mark.parametrize(
    "family,stage,message",
    [
        ("longcat_image", {"enable_lora": True}, "LoRA"),
        ("ovis_image", {"enable_lora": True}, "LoRA"),
        ("longcat_image", {"parallel_config": {"ulysses_degree": 2}}, "LongCatImageTransformer2DModel"),
        ("ovis_image", {"parallel_config": {"ulysses_degree": 2}}, "OvisImageTransformer2DModel"),
    ],
)
async def test_deploy_refuses_what_the_family_cannot_run(tiny_model, family, stage, message):
    with pytest.raises(ValueError) as err:
        await AsyncOmni(str(tiny_model(family)), deploy_config={"stages": [{"stage_id": 0, **stage}]}).start()
    assert family in str(err.value) and message in str(err.value)
