"""Images and audio into llm stages on real vLLM engines (CPU), through ``AsyncOmni``: greedy
outputs and prompt token counts equal vLLM's own ``LLM.chat`` / ``LLM.generate`` on the same
folder (tests/models/chat/mm_cases.py); bad media inputs name the offending part.

One engine per tiny fixture for the whole module; vLLM's answers are computed once per session.
Video: Idefics3 takes images only, so here a video part is checked to be refused naming the part.
Video in (``video_url`` parts, decoded frames in ``multi_modal_data``) is tested on the tiny Qwen2.5-VL
and Qwen3-VL fixtures against vLLM's ``LLM.chat`` / ``LLM.generate``: offline in
tests/models/chat/test_qwen_vl_vllm.py, over HTTP in tests/models/chat/test_vl_http.py.
"""

from __future__ import annotations

import os

import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.testing.streams import final_output
from tests.models.chat.mm_cases import (
    AUDIO_CASES,
    AUDIO_RAW,
    CLIP,
    ENGINE,
    GREEDY,
    IMG_A,
    IMG_B,
    LIMITS,
    VLM_CASES,
    VLM_RAW,
    audio_part,
    image,
    image_part,
    text,
    vllm_answers,
)

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process less per engine: faster start


@pytest.fixture(scope="module")
def vlm_ref(tiny_model):
    return vllm_answers(str(tiny_model("vlm")), "vlm")


@pytest.fixture(scope="module")
def audio_ref(tiny_model):
    return vllm_answers(str(tiny_model("audio_lm")), "audio_lm")


async def _engine(folder, **kw):
    # text+token_ids so that the tests compare ids too; the family's default is text
    engine = AsyncOmni(folder, stage_overrides={"0": {"engine_output_type": "text+token_ids"}}, **ENGINE, **kw)
    return await engine.start()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vlm(tiny_model, vlm_ref):
    engine = await _engine(tiny_model("vlm"), limit_mm_per_prompt=LIMITS)
    yield engine
    await engine.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def audio_lm(tiny_model, audio_ref):
    engine = await _engine(tiny_model("audio_lm"))
    yield engine
    await engine.shutdown()


async def run(omni, prompt):
    return await final_output(omni.generate(prompt, sampling_params_list=[dict(GREEDY)]))


def assert_same(out, answer):
    assert out.prompt_token_ids == answer.prompt_token_ids  # placeholders expanded as vLLM counts them
    assert (out.token_ids, out.text) == (answer.token_ids, answer.text)


@pytest.mark.parametrize("case", list(VLM_CASES))
async def test_vlm_chat_equals_llm_chat(vlm, vlm_ref, case):
    assert_same(await run(vlm, VLM_CASES[case].omni_prompt()), vlm_ref[case])


async def test_the_options_change_the_prompt(tiny_model, vlm_ref):
    """Both sides go through vLLM, so an option vLLM dropped would pass the parity tests unnoticed:
    check that each one changed the reference prompt."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model("vlm"))
    prompts = {name: tok.decode(a.prompt_token_ids) for name, a in vlm_ref.items()}
    assert "Picture 1: <fake_token_around_image>" in prompts["system_vision_ids"]  # chat_template_kwargs
    assert prompts["system_vision_ids"].startswith("<|im_start|>system\nbe brief<|im_end|>")
    assert prompts["continue_final"].endswith("<|im_start|>assistant\nthe picture shows")  # no <|im_end|>
    assert prompts["one_image"].endswith("<|im_start|>assistant\n")  # add_generation_prompt
    assert prompts["one_image"].count("<row_") == 4 and "<row_" not in prompts["no_splitting"]  # mm_processor_kwargs
    assert prompts["two_images"].count("<global-img>") == 2
    assert prompts["earlier_turn"].count("<global-img>") == 1 and prompts["earlier_turn"].count("<|im_start|>user") == 2


async def test_vlm_decoded_images_and_raw_prompt(vlm, vlm_ref):
    """A caller's own PIL images (``image_pil`` parts) and the LLM.generate prompt form."""
    case = VLM_CASES["one_image"]
    pil = [{"type": "image_pil", "image_pil": image(IMG_A)}, case.messages[0]["content"][1]]
    assert_same(await run(vlm, {"messages": [{"role": "user", "content": pil}]}), vlm_ref["one_image"])
    assert_same(await run(vlm, VLM_RAW), vlm_ref["raw"])


@pytest.mark.parametrize("case", list(AUDIO_CASES))
async def test_audio_chat_equals_llm_chat(audio_lm, audio_ref, case):
    assert_same(await run(audio_lm, AUDIO_CASES[case].omni_prompt()), audio_ref[case])


async def test_audio_raw_prompt(audio_lm, audio_ref):
    assert_same(await run(audio_lm, AUDIO_RAW), audio_ref["raw"])


@pytest.mark.parametrize(
    "content, field, message",
    [
        (
            [image_part(IMG_A), image_part(IMG_B), text("x"), image_part(IMG_A)],
            "messages[0].content[3].image_url",
            r"At most 2 image\(s\) may be provided in one prompt",
        ),
        (
            [text("x"), audio_part(CLIP)],
            "messages[0].content[1].input_audio",
            r"takes no audio input \(it takes image\)",
        ),
        (
            [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}],
            "messages[0].content[0].video_url",
            r"takes no video input",
        ),
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "messages", r"cannot identify"),
    ],
)
async def test_bad_media_name_the_part(vlm, content, field, message):
    with pytest.raises(InvalidRequestError, match=message) as e:
        await run(vlm, {"messages": [{"role": "user", "content": content}]})
    assert e.value.field == field


async def test_bad_multi_modal_data_names_the_item(vlm, audio_lm):
    three = {"prompt": "<image><image><image>", "multi_modal_data": {"image": [image(IMG_A)] * 3}}
    with pytest.raises(InvalidRequestError, match=r"At most 2 image") as e:
        await run(vlm, three)
    assert e.value.field == "multi_modal_data.image[2]"
    with pytest.raises(InvalidRequestError, match=r"takes no image input") as e:
        await run(audio_lm, {"prompt": "hi", "multi_modal_data": {"image": image(IMG_A)}})
    assert e.value.field == "multi_modal_data.image[0]"


async def test_engines_serve_after_bad_inputs(vlm, vlm_ref, audio_lm, audio_ref):
    assert_same(await run(vlm, VLM_CASES["two_images"].omni_prompt()), vlm_ref["two_images"])
    assert_same(await run(audio_lm, AUDIO_CASES["one_clip"].omni_prompt()), audio_ref["one_clip"])
