"""Images and video into the chat family on the tiny ``qwen2_5_vl`` and ``qwen3_vl`` fixtures, offline
(``AsyncOmni`` and ``Omni``) on real vLLM engines (CPU): greedy outputs and prompt ids equal vLLM's own
``LLM.chat`` / ``LLM.generate`` on the same folder (mm_cases.py) for chat messages with ``image_url`` /
``video_url`` parts (``data:`` and ``file://``), for ``prompt`` + ``multi_modal_data`` with decoded video
frames, alone and all at once; bad video inputs are errors naming the field. (``Omni``, the
synchronous entry point, with video: test_omni_sync.py.)

One engine per fixture, shared by the module (parametrised, so one is up at a time); vLLM's answers
are computed once per session.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.testing.streams import final_output
from tests.models.chat.mm_cases import (
    CLIP,
    ENGINE,
    FRAMES,
    FRAMES_META,
    GREEDY,
    VID_A,
    VL_CASES,
    VL_FAMILIES,
    VL_LIMITS,
    VL_RAW,
    b64,
    text,
    video_part,
    vllm_answers,
)

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def media_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl-media")
    (root / "a.mp4").write_bytes(VID_A)
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=VL_FAMILIES)
async def vl(request, tiny_model, media_root):
    """(engine, vLLM's answers, family); the answers first: one engine at a time."""
    family = request.param
    ref = vllm_answers(str(tiny_model(family)), family)
    # text+token_ids so that the tests compare ids too; the family's default is text
    engine = AsyncOmni(
        tiny_model(family),
        limit_mm_per_prompt=VL_LIMITS,
        **ENGINE,
        stage_overrides={
            "0": {"engine_output_type": "text+token_ids", "engine_args": {"allowed_local_media_path": str(media_root)}}
        },
    )
    await engine.start()
    yield engine, ref, family
    await engine.shutdown()


async def run(omni, prompt):
    return await final_output(omni.generate(prompt, sampling_params_list=[dict(GREEDY)]))


def assert_same(out, answer):
    assert out.prompt_token_ids == answer.prompt_token_ids  # placeholders expanded as vLLM counts them
    assert (out.token_ids, out.text) == (answer.token_ids, answer.text)


@pytest.mark.parametrize("case", list(VL_CASES))
async def test_chat_equals_llm_chat(vl, case):
    engine, ref, _ = vl
    assert_same(await run(engine, VL_CASES[case].omni_prompt()), ref[case])


@pytest.mark.parametrize("name", list(VL_RAW))
async def test_prompt_and_multi_modal_data_equal_llm_generate(vl, name):
    """The LLM.generate form: placeholders in the text, a PIL image and/or decoded frames + metadata."""
    engine, ref, _ = vl
    assert_same(await run(engine, VL_RAW[name]), ref[name])


async def test_video_by_file_url(vl, media_root):
    """The same clip from disk (under the engine's allowed_local_media_path) as from a data: URL."""
    engine, ref, _ = vl
    content = [
        {"type": "video_url", "video_url": {"url": f"file://{media_root}/a.mp4"}},
        VL_CASES["one_video"].messages[0]["content"][1],
    ]
    assert_same(await run(engine, {"messages": [{"role": "user", "content": content}]}), ref["one_video"])


async def test_all_at_once_equal_solo(vl):
    """Every chat case and raw prompt in flight together: batching images and videos of different
    shapes must not change anyone's answer."""
    engine, ref, _ = vl
    prompts = {**{k: c.omni_prompt() for k, c in VL_CASES.items()}, **VL_RAW}
    outs = await asyncio.gather(*(run(engine, p) for p in prompts.values()))
    for name, out in zip(prompts, outs):
        assert_same(out, ref[name])


async def test_the_media_reach_the_prompt(vl, tiny_model):
    """Both sides go through vLLM, so media vLLM dropped would pass the parity tests unnoticed: check
    the reference prompts hold every item's placeholders (and the family's video layout)."""
    from transformers import AutoTokenizer

    _, ref, family = vl
    tok = AutoTokenizer.from_pretrained(tiny_model(family))
    prompts = {name: tok.decode(a.prompt_token_ids) for name, a in ref.items()}
    for name in ("one_video", "video_in_earlier_turn", "raw_frames"):
        assert prompts[name].count("<|video_pad|>") >= 2 and "<|image_pad|>" not in prompts[name], name
    for name in ("image_and_video", "raw_image_and_frames"):
        assert "<|image_pad|>" in prompts[name] and "<|video_pad|>" in prompts[name], name
    assert "Picture 1: <|vision_start|>" in prompts["two_images_vision_ids"]  # chat_template_kwargs
    assert prompts["image_and_video"].startswith("<|im_start|>system\nbe brief<|im_end|>")
    assert prompts["video_in_earlier_turn"].count("<|im_start|>user") == 2
    if family == "qwen3_vl":  # Qwen3-VL interleaves a timestamp before each temporal patch's tokens
        assert prompts["raw_frames"].count(" seconds>") == 2


@pytest.mark.parametrize(
    "part, message",
    [
        (
            {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64(b"\x00" * 64)}},
            "Could not open video stream",
        ),
        (
            {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64(CLIP)}},  # audio only
            "Could not open video stream",
        ),
    ],
)
async def test_undecodable_video_is_refused(vl, part, message):
    """vLLM decodes the media of an offline prompt itself and names no part; the error names the
    prompt (the HTTP server checks each part first and names it: tests/models/chat/test_vl_http.py)."""
    engine, _, _ = vl
    with pytest.raises(InvalidRequestError, match=message) as e:
        await run(engine, {"messages": [{"role": "user", "content": [text("look"), part]}]})
    assert e.value.field == "messages"


async def test_more_videos_than_the_limit_name_the_part(vl):
    engine, _, _ = vl
    with pytest.raises(InvalidRequestError, match=r"At most 1 video\(s\)") as e:
        await run(
            engine, {"messages": [{"role": "user", "content": [video_part(VID_A), text("and"), video_part(VID_A)]}]}
        )
    assert e.value.field == "messages[0].content[2].video_url"
    with pytest.raises(InvalidRequestError, match=r"At most 1 video\(s\)") as e:
        await run(engine, {"prompt": "x", "multi_modal_data": {"video": [(FRAMES, FRAMES_META)] * 2}})
    assert e.value.field == "multi_modal_data.video[1]"


@pytest.mark.parametrize(
    "video, message",
    [
        (FRAMES, "Video metadata is required"),  # Qwen's processors place and time frames by it
        ((np.zeros((2, 3), np.uint8), FRAMES_META), "Failed to apply"),
    ],
)
async def test_bad_frames_are_refused(vl, video, message):
    engine, _, _ = vl
    with pytest.raises(InvalidRequestError, match=message):
        await run(
            engine, {"prompt": "<|vision_start|><|video_pad|><|vision_end|>", "multi_modal_data": {"video": video}}
        )


async def test_engine_serves_after_bad_inputs(vl):
    engine, ref, _ = vl
    assert_same(await run(engine, VL_CASES["image_and_video"].omni_prompt()), ref["image_and_video"])
