"""The tiny multimodal fixtures (``vlm``: Idefics3, ``audio_lm``: Qwen2-Audio) are real models:
the chat family claims them, and transformers' own processor + ``generate`` give the same prompt
ids and greedy tokens as vLLM (which guards the fixtures: tokenizer, template, processor, weights)."""

from __future__ import annotations

import pytest
import torch

from omnistage.pipeline import resolve_pipeline
from tests.models.chat.mm_cases import AUDIO_CASES, CLIP, GREEDY, IMG_A, VLM_CASES, audio, image, vllm_answers


@pytest.mark.parametrize("name", ["vlm", "audio_lm"])
def test_the_chat_family_claims_them(tiny_model, name):
    assert resolve_pipeline(tiny_model(name)).name == "chat"


KIND = {"image_url": "image", "input_audio": "audio", "audio_url": "audio"}


def _transformers_generate(folder, conversation, **media):
    from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2AudioForConditionalGeneration

    processor = AutoProcessor.from_pretrained(folder)
    # the processor's chat template sees media as {"type": "image"} / {"type": "audio"} parts
    messages = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else [
        p if p["type"] == "text" else {"type": KIND[p["type"]]} for p in m["content"]]} for m in conversation]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=[prompt], return_tensors="pt", **media)
    cls = Qwen2AudioForConditionalGeneration if "audio" in media else AutoModelForImageTextToText
    model = cls.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=GREEDY["max_tokens"], do_sample=False)
    ids = inputs["input_ids"][0].tolist()
    return ids, out[0, len(ids):].tolist()


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
    ids, generated = _transformers_generate(folder, AUDIO_CASES["one_clip"].messages, audio=[wave],
                                            sampling_rate=rate)
    assert ids == answer.prompt_token_ids
    assert generated == answer.token_ids
