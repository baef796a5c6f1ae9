"""ERNIE-Image beyond its row in the shared harness (tests/models/image_families.py, where ``use_pe`` is off):
the prompt enhancer on by default, as diffusers' ``ErnieImagePipeline.__call__``, its rewrite answered as
``revised_prompt`` and the picture drawn from it equal to the pipeline's (fp32, CPU, same seed); ``use_pe: false``
rewrites nothing; a folder without an enhancer; the declared defaults; bad input naming the field."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import ernie_image
from omnistage.testing.staggered import generate_final
from tests.stages.diffusion.helpers import noise_image, reference_pipeline, tiny_family

pytestmark = pytest.mark.slow  # the reference pipeline and two engines: ~45 s
ONE_LOOP = pytest.mark.asyncio(loop_scope="module")
SIZE = {"height": 32, "width": 48}

folder, _, ref = tiny_family("ernie_image", reference="ErnieImagePipeline")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(folder):
    async with AsyncOmni(folder) as engine:
        yield engine


def reference(ref, prompt: str, seed: int, **kw):
    """The pipeline's call, its enhancer sampling from the global generator seeded as the request's seed."""
    torch.manual_seed(seed)
    return ref(prompt=prompt, generator=torch.Generator().manual_seed(seed), **SIZE, **kw)


def test_defaults_are_the_pipelines():
    from diffusers import ErnieImagePipeline

    sig = inspect.signature(ErnieImagePipeline.__call__).parameters  # the reference's own defaults
    assert ernie_image.PIPELINE.stages[0].default_params == {
        "num_inference_steps": sig["num_inference_steps"].default,
        "guidance_scale": sig["guidance_scale"].default,
    }
    assert sig["use_pe"].default is True and ernie_image.PIPELINE.extra_body_params == {"use_pe": bool}


@ONE_LOOP
async def test_enhancer_by_default_rewrites_as_the_pipeline(omni, ref):
    """Two requests at once (their steps share forwards), each rewritten and drawn as the pipeline alone."""
    cases = [("a red cat", 5, 2, 4.0), ("mountains at sunset", 9, 3, 1.0)]
    outs = await __import__("asyncio").gather(
        *(
            generate_final(omni, p, {**SIZE, "seed": s, "num_inference_steps": n, "guidance_scale": g})
            for p, s, n, g in cases
        )
    )
    for (prompt, seed, steps, g), out in zip(cases, outs):
        want = reference(ref, prompt, seed, num_inference_steps=steps, guidance_scale=g)
        assert want.revised_prompts is not None and want.revised_prompts[0] != prompt
        assert out.revised_prompt == want.revised_prompts[0]
        # one uint8 level: the shared forward pads the shorter prompt (masked), which moves the float sums by
        # rounding alone (the harness measures 1e-5 on the latents), enough to flip a pixel's rounding
        got = np.asarray(out.images[0]).astype(int)
        assert np.abs(got - np.asarray(want.images[0]).astype(int)).max() <= 1
    assert outs[0].revised_prompt != outs[1].revised_prompt


@ONE_LOOP
async def test_use_pe_false_rewrites_nothing(omni, ref):
    params = {**SIZE, "seed": 5, "num_inference_steps": 2, "extra_args": {"use_pe": False}}
    out = await generate_final(omni, "a red cat", params)
    want = reference(ref, "a red cat", 5, num_inference_steps=2, use_pe=False)
    assert out.revised_prompt is None and want.revised_prompts is None
    assert np.array_equal(np.asarray(out.images[0]), np.asarray(want.images[0]))


@ONE_LOOP
@pytest.mark.parametrize(
    "params,images,field",
    [
        (dict(extra_args={"use_pe": "maybe"}), 0, "use_pe"),
        (dict(height=40), 0, "height"),
        (dict(max_sequence_length=64), 0, "max_sequence_length"),
        (dict(true_cfg_scale=2.0), 0, "true_cfg_scale"),
        ({}, 1, "multi_modal_data.image"),
    ],
)
async def test_bad_input_names_the_field(omni, params, images, field):
    prompt: dict = {"prompt": "a cat"}
    if images:
        prompt["multi_modal_data"] = {"image": [noise_image(32, 48, 0)]}
    with pytest.raises(InvalidRequestError) as err:
        await generate_final(omni, prompt, {**SIZE, "num_inference_steps": 1, **params})
    assert err.value.field == field


@ONE_LOOP
async def test_folder_without_enhancer(folder, tmp_path):
    """The pipeline skips a missing enhancer in silence; here the default rewrites nothing and asking for it is a
    400 naming ``use_pe``."""
    bare = tmp_path / "no-pe"
    reference_pipeline("ErnieImagePipeline", folder, pe=None, pe_tokenizer=None).save_pretrained(bare)
    async with AsyncOmni(str(bare)) as engine:
        out = await generate_final(engine, "a red cat", {**SIZE, "seed": 1, "num_inference_steps": 1})
        assert out.revised_prompt is None and len(out.images) == 1
        with pytest.raises(InvalidRequestError) as err:
            await generate_final(
                engine, "a red cat", {**SIZE, "num_inference_steps": 1, "extra_args": {"use_pe": True}}
            )
        assert err.value.field == "use_pe"
