"""Qwen-Image text-to-image on the step-batched diffusion engine, through ``AsyncOmni``, checked against
diffusers' own ``QwenImagePipeline.__call__`` (fp32, CPU, same seed): the family's special cases.
Solo-equals-diffusers, concurrent batching and HTTP are its row in the shared harness
(tests/models/image_families.py)."""

from __future__ import annotations

import asyncio
import inspect

import pytest
import torch

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import qwen_image
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final

from .common import DEPLOY, gen, image, max_diff, reference

SMALL = dict(height=32, width=48)  # x8 VAE, 2x2 packing: a 4x6 latent, 2x3 = 6 tokens


@pytest.fixture(scope="module")
def t2i(tiny_model):
    return str(tiny_model("qwen_image"))


@pytest.fixture(scope="module")
def ref(t2i):
    return reference("QwenImagePipeline", t2i)


def test_folders_resolve_to_their_pipelines(t2i, tiny_model):
    assert resolve_pipeline(t2i).name == "qwen_image"
    assert resolve_pipeline(str(tiny_model("qwen_image_edit"))).name == "qwen_image_edit"
    assert resolve_pipeline(str(tiny_model("qwen_image_edit_plus"))).name == "qwen_image_edit_plus"


def test_tiny_tokenizer_drops_the_templates_like_the_real_one(ref, tiny_model):
    """The pipelines drop a fixed number of template tokens (the system prompt, 34 / 64 with Qwen's own
    tokenizer); the locally trained tokenizer must give the templates exactly that many, or the prompt itself
    would be cut or part of the system prompt kept."""
    edit = reference("QwenImageEditPipeline", tiny_model("qwen_image_edit"))
    for pipe in (ref, edit):
        prefix = pipe.prompt_template_encode.split("{}")[0].replace("<|vision_start|><|image_pad|><|vision_end|>", "")
        assert len(pipe.tokenizer(prefix).input_ids) == pipe.prompt_template_encode_start_idx, type(pipe).__name__


def test_defaults_are_the_pipelines():
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline, QwenImagePipeline

    declared = (qwen_image.PIPELINE, qwen_image.EDIT, qwen_image.EDIT_PLUS)
    for cls, pipeline in zip((QwenImagePipeline, QwenImageEditPipeline, QwenImageEditPlusPipeline), declared):
        sig = inspect.signature(cls.__call__).parameters
        assert pipeline.stages[0].default_params["num_inference_steps"] == sig["num_inference_steps"].default
        assert qwen_image.adapter.DEFAULT_TRUE_CFG == sig["true_cfg_scale"].default
        assert qwen_image.adapter.MAX_SEQUENCE_LENGTH == sig["max_sequence_length"].default


async def test_text_length_cut_equals_diffusers_call(t2i, ref):
    """max_sequence_length (a standard knob) cuts the prompt's embeddings as encode_prompt does."""
    prompt = "a watercolor painting of mountains at sunset, city skyline at night with neon lights"
    kw = dict(num_inference_steps=2, **SMALL)
    params = {**kw, "seed": 3, "output_type": "latent", "true_cfg_scale": 2.0}
    async with AsyncOmni(t2i, deploy_config=DEPLOY) as omni:
        out = await generate_final(
            omni, {"prompt": prompt, "negative_prompt": "dark"}, {**params, "max_sequence_length": 9}
        )
        full = await generate_final(omni, {"prompt": prompt, "negative_prompt": "dark"}, params)
    expected = ref(
        prompt,
        negative_prompt="dark",
        true_cfg_scale=2.0,
        max_sequence_length=9,
        generator=gen(3),
        output_type="latent",
        **kw,
    ).images
    assert max_diff(out.latents, expected) == 0.0
    assert not torch.equal(out.latents, full.latents)


async def test_sizes_are_separate_batch_keys(t2i):
    """RoPE reads the first row's image shape for the whole batch: other sizes never share a forward."""
    kw = dict(num_inference_steps=3, output_type="latent", seed=1)
    variants = [dict(height=32, width=48), dict(height=48, width=32), dict(height=32, width=32)]
    async with AsyncOmni(t2i, deploy_config=DEPLOY) as omni:
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
        (dict(width=24), "a cat", "width"),
        (dict(max_sequence_length=1025), "a cat", "max_sequence_length"),
        (dict(num_inference_steps=1), "a cat", "num_inference_steps"),  # NaN sigmas with shift_terminal
        (dict(), {"prompt": "a cat", "multi_modal_data": {"image": "__image__"}}, "multi_modal_data.image"),
    ],
)
async def test_bad_input_names_the_field(t2i, params, prompt, field):
    if isinstance(prompt, dict):  # an edit request to the text-to-image checkpoint
        prompt = {**prompt, "multi_modal_data": {"image": image(32, 32)}}
    async with AsyncOmni(t2i, deploy_config=DEPLOY) as omni:
        with pytest.raises(InvalidRequestError) as err:
            await generate_final(omni, prompt, {**SMALL, "num_inference_steps": 2, **params})
    assert err.value.field == field
