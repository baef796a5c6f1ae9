"""prompt_expand end to end: a real vLLM expander (tiny chat model) feeding the
sd3 family's diffusion adapter; the image is checked against diffusers'
StableDiffusion3Pipeline given the expanded text."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.models.prompt_expand import DEFAULT_SYSTEM_PROMPT
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.streams import all_outputs, finished_by_stage
from tests.stages.diffusion.helpers import reference_pipeline

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

SYSTEM = "Describe the picture in detail."
IMAGE = {"num_inference_steps": 3, "height": 32, "width": 32, "seed": 7, "guidance_scale": 1.0}
EXPAND = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def folder(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("prompt-expand")
    (root / "llm").symlink_to(tiny_model("chat"))
    (root / "image").symlink_to(tiny_model("sd3"))
    (root / "omnistage.json").write_text(json.dumps({"pipeline": "prompt_expand", "system_prompt": SYSTEM}))
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(folder):
    engine = AsyncOmni(folder, dtype="float32")
    await engine.start()
    yield engine
    await engine.shutdown()


async def collect(omni, prompt, modalities=None, system=None):
    p = {"prompt": prompt}
    if system is not None:
        p["system_prompt"] = system
    outs = await all_outputs(omni.generate(p, sampling_params_list=[EXPAND, IMAGE], output_modalities=modalities))
    return finished_by_stage(outs), outs


def expected_prompt_ids(folder, system, user):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder / "llm")
    text = tok.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": user}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return tok.encode(text, add_special_tokens=False)


async def test_resolves_from_folder(folder):
    assert resolve_pipeline(folder).name == "prompt_expand"


async def test_text_and_image(omni, folder):
    finals, _ = await collect(omni, "a red cat")
    text_out, image_out = finals[0], finals[1]
    # The expander saw the folder's system prompt through the chat template.
    assert text_out.prompt_token_ids == expected_prompt_ids(folder, SYSTEM, "a red cat")
    assert text_out.text and text_out.metrics[0]["num_tokens"] == EXPAND["max_tokens"]
    ref = reference_pipeline("StableDiffusion3Pipeline", folder / "image", dtype=torch.float32)
    kw = {k: v for k, v in IMAGE.items() if k != "seed"}
    expected = ref(text_out.text.strip(), generator=torch.Generator().manual_seed(IMAGE["seed"]), **kw).images[0]
    assert len(image_out.images) == 1
    assert np.array_equal(np.asarray(image_out.images[0]), np.asarray(expected))


async def test_text_only_skips_the_image_stage(omni):
    finals, outs = await collect(omni, "a red cat", modalities=["text"])
    assert {o.stage_id for o in outs} == {0}
    assert finals[0].text and not finals[0].images


async def test_image_only_still_expands(omni, folder):
    finals, outs = await collect(omni, "a red cat", modalities=["image"])
    text_only, _ = await collect(omni, "a red cat", modalities=["text"])
    assert {o.stage_id for o in outs} == {1}
    assert finals[1].images and finals[1].text is None
    # Same expansion as the text request (greedy), so the same image as the full request.
    full, _ = await collect(omni, "a red cat")
    assert np.array_equal(np.asarray(finals[1].images[0]), np.asarray(full[1].images[0]))
    assert full[0].text == text_only[0].text


async def test_per_request_system_prompt(omni, folder):
    finals, _ = await collect(omni, "a red cat", modalities=["text"], system=DEFAULT_SYSTEM_PROMPT)
    assert finals[0].prompt_token_ids == expected_prompt_ids(folder, DEFAULT_SYSTEM_PROMPT, "a red cat")


async def test_empty_prompt_is_a_bad_request(omni):
    with pytest.raises(ValueError, match="prompt"):
        await collect(omni, "   ")
