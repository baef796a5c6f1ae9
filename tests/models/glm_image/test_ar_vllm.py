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
from omnistage.testing.streams import all_outputs, finished_by_stage
from tests.stages.diffusion.helpers import reference_pipeline

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
    return proc.apply_chat_template(
        msgs, tokenize=True, target_h=height, target_w=width, return_dict=True, return_tensors="pt"
    )


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
    plain = model.generate(
        input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=n, do_sample=False
    )  # no grids: 1-D positions
    k = inputs["input_ids"].shape[1]
    return inputs["input_ids"][0].tolist(), out[0, k:].tolist(), plain[0, k:].tolist()


DIT = {"num_inference_steps": 3, "guidance_scale": 1.5, "seed": 5}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(folder):
    """Both stages through AsyncOmni, one start for the end-to-end tests."""
    engine = AsyncOmni(folder, dtype="float32")
    await engine.start()
    yield engine
    await engine.shutdown()


async def final_image(omni, prompt):
    """One request through both stages (greedy AR, DIT params) -> the diffusion stage's image."""
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[{}, DIT]))
    return finished_by_stage(outs)[1].images[0]


def dit_kwargs() -> dict:
    """DIT as diffusers' __call__ arguments."""
    return {
        "num_inference_steps": DIT["num_inference_steps"],
        "guidance_scale": DIT["guidance_scale"],
        "generator": torch.Generator().manual_seed(DIT["seed"]),
    }


@pytest.fixture(scope="module")
def dit_reference(folder):
    return reference_pipeline("GlmImagePipeline", folder, dtype=torch.float32)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ar_engine(folder):
    ctx = StageContext(
        spec=PIPELINE.stages[0],
        deploy=StageDeployConfig(stage_id=0, max_model_len=1024, dtype="float32"),
        model=str(folder),
    )
    engine = GlmImageAREngine(ctx)
    await engine.start()
    yield engine
    await engine.shutdown()


async def ar_run(engine, rid, inputs, params):
    """(prompt ids, as the first update that carries them gives them; all token ids; the last update)."""
    outs = await all_outputs(engine.generate(StageRequest(rid, inputs, params)))
    first = next((o.data["prompt_token_ids"] for o in outs if o.data.get("prompt_token_ids")), None)
    return first, [i for o in outs for i in o.data.get("token_ids", [])], outs[-1]


async def test_greedy_equals_transformers_generate(ar_engine, hf_greedy):
    prompt_ids, expected, plain = hf_greedy
    assert expected != plain  # the 2-D decode positions matter for this model: the check below can fail
    got_prompt, ids, last = await ar_run(ar_engine, "g", {"prompt": PROMPT, "image_size": (H, W)}, GREEDY)
    assert got_prompt == prompt_ids
    assert ids == expected and last.finish_reason == "length"
    # the size can also ride in the stage's params
    _, ids2, _ = await ar_run(ar_engine, "g2", {"prompt": PROMPT}, {"height": H, "width": W, **GREEDY})
    assert ids2 == expected


async def test_concurrent_requests_of_different_sizes(ar_engine, folder):
    """Each request keeps its own decode-position table inside one batch."""
    import asyncio

    from transformers import GlmImageForConditionalGeneration

    model = GlmImageForConditionalGeneration.from_pretrained(folder / "vision_language_encoder", dtype=torch.float32)
    sizes = [(64, 96), (96, 64), (32, 32)]
    runs = [
        ar_run(ar_engine, f"c{i}", {"prompt": "green tree", "image_size": (h, w)}, GREEDY)
        for i, (h, w) in enumerate(sizes)
    ]
    results = await asyncio.gather(*runs)
    for (h, w), (_, ids, _) in zip(sizes, results):
        inputs = hf_inputs(folder, "green tree", h, w)
        out = model.generate(**inputs, max_new_tokens=generated_layout(h, w, False)[1], do_sample=False)
        assert ids == out[0, inputs["input_ids"].shape[1] :].tolist(), (h, w)


async def test_bad_requests_name_the_field(ar_engine):
    cases = [
        ({"prompt": PROMPT, "image_size": (50, 64)}, {}, "image_size.height"),
        ({"prompt": PROMPT}, {"height": 64, "width": 64, "max_tokens": 5}, "max_tokens"),
        ({"prompt": ""}, {}, "prompt"),
    ]
    for inputs, params, field in cases:
        with pytest.raises(ValueError, match=field):
            await ar_run(ar_engine, "bad", inputs, params)


async def test_end_to_end_through_omni(omni, folder, hf_greedy, dit_reference):
    assert resolve_pipeline(folder).name == "glm_image"
    _, expected_ids, _ = hf_greedy
    image = await final_image(omni, {"prompt": PROMPT, "image_size": (H, W)})
    ref = dit_reference
    (th, tw), (ph, pw) = target_grids(H, W)
    prior = ref._upsample_token_ids(torch.tensor(expected_ids[ph * pw : ph * pw + th * tw]), th, tw)
    expected = ref(PROMPT, height=H, width=W, prior_token_ids=prior, **dit_kwargs()).images[0]
    assert np.array_equal(np.asarray(image), np.asarray(expected))


# ---------------------------------------------------------------- image-to-image

I2I_PROMPT = "make it red"


def source_image(seed: int, height: int, width: int):
    from PIL import Image

    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8))


def hf_i2i(folder, images, prompt=I2I_PROMPT, height=H, width=W):
    """transformers' greedy i2i generation, and the source images' VQ ids as its forward computes them."""
    from transformers import GlmImageForConditionalGeneration, GlmImageProcessor

    proc = GlmImageProcessor.from_pretrained(folder / "processor")
    model = GlmImageForConditionalGeneration.from_pretrained(folder / "vision_language_encoder", dtype=torch.float32)
    content = [{"type": "image", "image": im} for im in images] + [{"type": "text", "text": prompt}]
    inputs = proc.apply_chat_template(
        [[{"role": "user", "content": content}]],
        tokenize=True,
        target_h=height,
        target_w=width,
        return_dict=True,
        return_tensors="pt",
    )
    out = model.generate(**inputs, max_new_tokens=generated_layout(height, width, True)[1], do_sample=False)
    grids = inputs["image_grid_thw"][: len(images)]
    vq = model.model.get_image_tokens(
        model.model.get_image_features(inputs["pixel_values"], grids).pooler_output, grids
    )
    k = inputs["input_ids"].shape[1]
    return inputs["input_ids"][0].tolist(), out[0, k:].tolist(), vq.view(-1).tolist(), grids.tolist()


async def test_i2i_greedy_equals_transformers_generate(ar_engine, folder):
    img = source_image(0, 64, 96)
    prompt_ids, expected, vq, grids = hf_i2i(folder, [img])
    assert len(expected) == 2 * 3 + 1  # only the target grid and the end token are drawn
    got_prompt, ids, last = await ar_run(
        ar_engine,
        "i",
        {"prompt": I2I_PROMPT, "multi_modal_data": {"image": img}, "image_size": (H, W)},
        GREEDY,
    )
    assert got_prompt == prompt_ids and ids == expected
    first = (
        await all_outputs(
            ar_engine.generate(StageRequest("i2", {"prompt": I2I_PROMPT, "multi_modal_data": {"image": img}}, GREEDY))
        )
    )[0]
    # no size given: the source image's size; its ids and grid ride on the first output for the DiT stage
    assert first.data["prior_token_image_ids"] == vq and first.data["source_image_grid_thw"] == grids == [[1, 2, 3]]
    # the source image is really read: another image, other tokens
    _, other, _ = await ar_run(
        ar_engine,
        "i3",
        {
            "prompt": I2I_PROMPT,
            "multi_modal_data": {"image": source_image(1, 64, 96)},
            "image_size": (H, W),
        },
        GREEDY,
    )
    assert other == hf_i2i(folder, [source_image(1, 64, 96)])[1] and other != expected


async def test_i2i_two_sources_and_t2i_in_one_batch(ar_engine, folder):
    import asyncio

    two = [source_image(2, 64, 64), source_image(3, 96, 64)]
    runs = [
        ar_run(
            ar_engine,
            "two",
            {
                "prompt": I2I_PROMPT,
                "multi_modal_data": {"image": two},
                "image_size": (32, 64),
            },
            GREEDY,
        ),
        ar_run(ar_engine, "t2i", {"prompt": PROMPT, "image_size": (H, W)}, GREEDY),
    ]
    (_, ids_two, _), (_, ids_t2i, _) = await asyncio.gather(*runs)
    assert ids_two == hf_i2i(folder, two, height=32, width=64)[1]
    from transformers import GlmImageForConditionalGeneration

    model = GlmImageForConditionalGeneration.from_pretrained(folder / "vision_language_encoder", dtype=torch.float32)
    inputs = hf_inputs(folder, PROMPT, H, W)
    out = model.generate(**inputs, max_new_tokens=generated_layout(H, W, False)[1], do_sample=False)
    assert ids_t2i == out[0, inputs["input_ids"].shape[1] :].tolist()


async def test_i2i_bad_source_images_name_the_field(ar_engine):
    cases = [
        source_image(0, 32, 160),  # aspect ratio beyond the processor's 4:1
        "not an image",
    ]
    for image in cases:
        with pytest.raises(ValueError, match=r"multi_modal_data\.image"):
            await ar_run(ar_engine, "bad-i2i", {"prompt": I2I_PROMPT, "multi_modal_data": {"image": image}}, GREEDY)
    # still serving
    _, ids, _ = await ar_run(
        ar_engine, "ok", {"prompt": I2I_PROMPT, "multi_modal_data": {"image": source_image(0, 64, 96)}}, GREEDY
    )
    assert len(ids) == 7


async def test_i2i_end_to_end_through_omni(omni, folder, dit_reference):
    """Both stages: the DiT conditions on the AR's target ids, the source ids and the source image,
    exactly as diffusers' GlmImagePipeline given the AR outputs transformers computes."""
    img = source_image(4, 64, 96)
    _, ar_ids, vq, grids = hf_i2i(folder, [img])
    image = await final_image(omni, {"prompt": I2I_PROMPT, "multi_modal_data": {"image": img}})
    ref = dit_reference
    (th, tw), _ = target_grids(H, W)
    up = ref._upsample_token_ids
    ((_, sh, sw),) = grids
    expected = ref(
        I2I_PROMPT,
        image=[img],
        height=H,
        width=W,
        prior_token_ids=up(torch.tensor(ar_ids[: th * tw]), th, tw),
        prior_token_image_ids=[up(torch.tensor(vq), sh, sw).view(-1)],
        source_image_grid_thw=[torch.tensor([[1, 2 * sh, 2 * sw]])],
        **dit_kwargs(),
    ).images[0]
    assert np.array_equal(np.asarray(image), np.asarray(expected))
