"""The tiny multimodal fixtures (``vlm``: Idefics3, ``audio_lm``: Qwen2-Audio, ``qwen2_5_vl``,
``qwen3_vl``) are real models: the chat family claims them, and transformers' own processor +
``generate`` give the same prompt ids and greedy tokens as vLLM (which guards the fixtures:
tokenizer, template, processor, weights)."""

from __future__ import annotations

import pytest
import torch

from omnistage.pipeline import resolve_pipeline
from tests.models.chat.mm_cases import (
    AUDIO_CASES,
    CLIP,
    FRAMES,
    FRAMES_META,
    GREEDY,
    IMG_A,
    VL_CASES,
    VL_FAMILIES,
    VL_RAW,
    VLM_CASES,
    audio,
    image,
    vllm_answers,
)


@pytest.mark.parametrize("name", ["vlm", "audio_lm", *VL_FAMILIES])
def test_the_chat_family_claims_them(tiny_model, name):
    assert resolve_pipeline(tiny_model(name)).name == "chat"


KIND = {"image_url": "image", "input_audio": "audio", "audio_url": "audio"}


def _transformers_generate(folder, conversation, prompt=None, **media):
    """``prompt``: the text as it is (the LLM.generate form) instead of the chat template's."""
    from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2AudioForConditionalGeneration

    processor = AutoProcessor.from_pretrained(folder)
    if prompt is None:
        # the processor's chat template sees media as {"type": "image"} / {"type": "audio"} parts
        messages = [
            {
                "role": m["role"],
                "content": m["content"]
                if isinstance(m["content"], str)
                else [p if p["type"] == "text" else {"type": KIND[p["type"]]} for p in m["content"]],
            }
            for m in conversation
        ]
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=[prompt], return_tensors="pt", **media)
    cls = Qwen2AudioForConditionalGeneration if "audio" in media else AutoModelForImageTextToText
    model = cls.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=GREEDY["max_tokens"], do_sample=False)
    ids = inputs["input_ids"][0].tolist()
    return ids, out[0, len(ids) :].tolist()


@pytest.mark.vllm
def test_vlm_equals_transformers(tiny_model):
    folder = tiny_model("vlm")
    answer = vllm_answers(str(folder), "vlm")["one_image"]
    ids, generated = _transformers_generate(folder, VLM_CASES["one_image"].messages, images=[[image(IMG_A)]])
    assert ids == answer.prompt_token_ids
    assert generated == answer.token_ids


@pytest.mark.vllm
def test_audio_lm_equals_transformers(tiny_model):
    folder = tiny_model("audio_lm")
    answer = vllm_answers(str(folder), "audio_lm")["one_clip"]
    wave, rate = audio(CLIP)
    ids, generated = _transformers_generate(folder, AUDIO_CASES["one_clip"].messages, audio=[wave], sampling_rate=rate)
    assert ids == answer.prompt_token_ids
    assert generated == answer.token_ids


@pytest.mark.vllm
@pytest.mark.parametrize("family", VL_FAMILIES)
def test_qwen_vl_image_equals_transformers(tiny_model, family):
    folder = tiny_model(family)
    answer = vllm_answers(str(folder), family)["one_image"]
    ids, generated = _transformers_generate(folder, VL_CASES["one_image"].messages, images=[image(IMG_A)])
    assert ids == answer.prompt_token_ids
    assert generated == answer.token_ids


@pytest.mark.vllm
@pytest.mark.parametrize("family", VL_FAMILIES)
def test_qwen_vl_video_frames_equal_transformers(tiny_model, family):
    """The same decoded frames and metadata (no frame sampling on either side). Their shape matters for
    Qwen2.5-VL: after a video, transformers 5.19 starts the text's positions at the video's start plus
    its merged height/width extent, vLLM one past the largest position used, which is larger when the
    temporal positions (grid_t x tokens_per_second x seconds per grid) outrun height and width; for
    these frames (2 x 2 x 3 merged grid, temporal positions 0 and 2) the two rules agree."""
    from transformers.video_utils import VideoMetadata

    folder = tiny_model(family)
    answer = vllm_answers(str(folder), family)["raw_frames"]
    meta = VideoMetadata(**{k: v for k, v in FRAMES_META.items() if k != "do_sample_frames"})
    ids, generated = _transformers_generate(
        folder,
        None,
        prompt=VL_RAW["raw_frames"]["prompt"],
        videos=[FRAMES],
        video_metadata=[meta],
        do_sample_frames=False,
    )
    assert ids == answer.prompt_token_ids
    assert generated == answer.token_ids
