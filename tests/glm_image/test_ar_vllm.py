"""GLM-Image's AR stage on vLLM (out-of-tree model through the public plugin/ModelRegistry API)
against transformers' GlmImageForConditionalGeneration.generate, and the two stages end to end."""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.config.schema import StageDeployConfig
from omnistage.models.glm_image import PIPELINE
from omnistage.models.glm_image.ar_engine import GlmImageAREngine
from omnistage.models.glm_image.grid import generated_layout, target_grids
from omnistage.pipeline import StageContext, resolve_pipeline
from omnistage.stages.base import StageRequest

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

H, W = 64, 96
PROMPT = "a red cat"
GREEDY = {"temperature": 0.0}  # the stage engine alone gets no family defaults


@pytest.fixture(scope="module")
def folder(tiny_model):
    return tiny_model("glm_image")


def hf_inputs(folder, prompt, height, width):
    from transformers import GlmImageProcessor

    proc = GlmImageProcessor.from_pretrained(folder / "processor")
    msgs = [[{"role": "user", "content": [{"type": "text", "text": prompt}]}]]
    return proc.apply_chat_template(msgs, tokenize=True, target_h=height, target_w=width, return_dict=True,
                                    return_tensors="pt")


@pytest.fixture(scope="module")
def hf_greedy(folder):
    """transformers' greedy generation with GLM-Image's 2-D decode positions, and (as a control) without them."""
    from transformers import GlmImageForConditionalGeneration

    model = GlmImageForConditionalGeneration.from_pretrained(folder / "vision_language_encoder", dtype=torch.float32)
    inputs = hf_inputs(folder, PROMPT, H, W)
    n = generated_layout(H, W, False)[1]
    out = model.generate(**inputs, max_new_tokens=n, do_sample=False)
    # transformers caches the decode positions on the model between calls: clear them for the control
    model.model.rope_deltas, model.model._cached_decode_position_ids = None, None
    plain = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                           max_new_tokens=n, do_sample=False)  # no grids: 1-D positions
    k = inputs["input_ids"].shape[1]
    return inputs["input_ids"][0].tolist(), out[0, k:].tolist(), plain[0, k:].tolist()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ar_engine(folder):
    ctx = StageContext(spec=PIPELINE.stages[0], deploy=StageDeployConfig(stage_id=0, max_model_len=1024,
                                                                         dtype="float32"), model=str(folder))
    engine = GlmImageAREngine(ctx)
    await engine.start()
    yield engine
    await engine.shutdown()


async def ar_run(engine, rid, inputs, params):
    ids, first = [], None
    async for o in engine.generate(StageRequest(rid, inputs, params)):
        first = first or o.data.get("prompt_token_ids")
        ids += o.data.get("token_ids", [])
        last = o
    return first, ids, last


async def test_greedy_equals_transformers_generate(ar_engine, hf_greedy):
    prompt_ids, expected, plain = hf_greedy
    assert expected != plain  # the 2-D decode positions matter for this model: the check below can fail
    got_prompt, ids, last = await ar_run(ar_engine, "g", {"prompt": PROMPT,
                                                          "additional_information": {"height": H, "width": W}}, GREEDY)
    assert got_prompt == prompt_ids
    assert ids == expected and last.data["finish_reason"] == "length"
    # the size can also ride in the stage's params
    _, ids2, _ = await ar_run(ar_engine, "g2", {"prompt": PROMPT}, {"height": H, "width": W, **GREEDY})
    assert ids2 == expected


async def test_concurrent_requests_of_different_sizes(ar_engine, folder):
    """Each request keeps its own decode-position table inside one batch."""
    import asyncio

    from transformers import GlmImageForConditionalGeneration

    model = GlmImageForConditionalGeneration.from_pretrained(folder / "vision_language_encoder", dtype=torch.float32)
    sizes = [(64, 96), (96, 64), (32, 32)]
    runs = [ar_run(ar_engine, f"c{i}", {"prompt": "green tree", "additional_information": {"height": h, "width": w}},
                   GREEDY) for i, (h, w) in enumerate(sizes)]
    results = await asyncio.gather(*runs)
    for (h, w), (_, ids, _) in zip(sizes, results):
        inputs = hf_inputs(folder, "green tree", h, w)
        out = model.generate(**inputs, max_new_tokens=generated_layout(h, w, False)[1], do_sample=False)
        assert ids == out[0, inputs["input_ids"].shape[1]:].tolist(), (h, w)


async def test_bad_requests_name_the_field(ar_engine):
    cases = [({"prompt": PROMPT, "additional_information": {"height": 50, "width": 64}}, {}, "height"),
             ({"prompt": PROMPT}, {"height": 64, "width": 64, "max_tokens": 5}, "max_tokens"),
             ({"prompt": ""}, {}, "prompt")]
    for inputs, params, field in cases:
        with pytest.raises(ValueError, match=field):
            await ar_run(ar_engine, "bad", inputs, params)


async def test_end_to_end_through_omni(folder, hf_greedy):
    from diffusers import GlmImagePipeline

    assert resolve_pipeline(folder).name == "glm_image"
    _, expected_ids, _ = hf_greedy
    omni = AsyncOmni(folder, dtype="float32")
    await omni.start()
    try:
        dit = {"num_inference_steps": 3, "guidance_scale": 1.5, "seed": 5}
        prompt = {"prompt": PROMPT, "additional_information": {"height": H, "width": W}}
        outs = [o async for o in omni.generate(prompt, sampling_params_list=[{}, dit])]
    finally:
        await omni.shutdown()
    final = [o for o in outs if o.finished and o.stage_id == 1][0]
    ref = GlmImagePipeline.from_pretrained(folder, dtype=torch.float32)
    ref.set_progress_bar_config(disable=True)
    (th, tw), (ph, pw) = target_grids(H, W)
    prior = ref._upsample_token_ids(torch.tensor(expected_ids[ph * pw:ph * pw + th * tw]), th, tw)
    expected = ref(PROMPT, height=H, width=W, prior_token_ids=prior, num_inference_steps=3, guidance_scale=1.5,
                   generator=torch.Generator().manual_seed(5)).images[0]
    assert np.array_equal(np.asarray(final.images[0]), np.asarray(expected))
