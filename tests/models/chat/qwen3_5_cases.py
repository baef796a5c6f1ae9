"""Chat cases for the tiny ``qwen3_5`` fixture (text, an image, a video) and transformers' own greedy answers to
them: the processor's chat template and ``generate``, on the same media the server decodes."""

from __future__ import annotations

import base64
import functools
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.models.chat.mm_cases import VID_A, image, image_part, png, text, video_part

# an image whose answer differs from the text-only one (for most pictures this random model answers alike)
IMG = png(12, 64, 48)
CASES: dict[str, list[dict[str, Any]]] = {
    "text": [{"role": "user", "content": "hello there, who are you?"}],
    "image": [{"role": "user", "content": [image_part(IMG), text("describe the picture")]}],
    "video": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [video_part(VID_A), text("what happens?")]},
    ],
}
_KIND = {"image_url": "image", "video_url": "video"}
# vLLM's CPU Gated DeltaNet kernel runs in bfloat16 only ("CPU GDN attention requires BF16"), so the server runs
# the model in bfloat16; the reference runs the stored float32 weights.
SERVED_DTYPE = "bfloat16"
DTYPE = "float32"
MAX_TOKENS = 6
# bfloat16 moves this model's logits by up to 0.006 on these cases and 0.012 on other pictures tried (transformers,
# bfloat16 against float32, teacher-forced on every step): a greedy step whose two best logits are closer than that
# is a coin toss at the served precision, so a case is compared only where every step is clear of it.
MIN_MARGIN = 0.015
GREEDY = {"temperature": 0.0, "max_tokens": MAX_TOKENS}


@dataclass
class Answer:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    media_tokens: int  # the prompt tokens the media placeholders became (a video's timestamps included)
    margin: float  # the smallest gap between the best and the second-best logit over the greedy steps


def decoded_video(data: bytes) -> tuple[np.ndarray, Any]:
    """Every frame of an MP4 (PyAV) and its metadata: the frames the server's loader reads, sampled by the
    processor at its own rate on both sides."""
    import av
    from transformers.video_utils import VideoMetadata

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        fps = float(stream.average_rate)
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
    count = len(frames)
    return frames, VideoMetadata(
        total_num_frames=count, fps=fps, duration=count / fps, frames_indices=list(range(count))
    )


@functools.cache
def _model(folder: str):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=DTYPE).eval()
    assert model.dtype == getattr(torch, DTYPE)
    return AutoProcessor.from_pretrained(folder), model


def transformers_answer(folder: str, messages: list[dict[str, Any]]) -> Answer:
    """transformers' greedy answer: the processor's chat template (media as bare ``image`` / ``video`` parts),
    its image and video processors, ``generate`` with the request's ``max_tokens``."""
    import torch

    processor, model = _model(str(folder))
    media: dict[str, list] = {"images": [], "videos": [], "video_metadata": []}
    shown = []
    for m in messages:
        if isinstance(m["content"], str):
            shown.append(m)
            continue
        parts = []
        for p in m["content"]:
            kind = _KIND.get(p["type"])
            if kind is None:
                parts.append(p)
                continue
            parts.append({"type": kind})
            data = base64.b64decode(p[p["type"]]["url"].partition(",")[2])
            if kind == "image":
                media["images"].append(image(data))
            else:
                frames, meta = decoded_video(data)
                media["videos"].append(frames)
                media["video_metadata"].append(meta)
        shown.append({"role": m["role"], "content": parts})
    prompt = processor.apply_chat_template(shown, add_generation_prompt=True)
    inputs = processor(text=[prompt], return_tensors="pt", **{k: v for k, v in media.items() if v})
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=MAX_TOKENS, do_sample=False, output_scores=True, return_dict_in_generate=True
        )
    ids = inputs["input_ids"][0].tolist()
    generated = out.sequences[0, len(ids) :].tolist()
    top2 = torch.stack(out.scores)[:, 0].topk(2, dim=-1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    placeholders = len(media["images"]) + len(media["videos"])  # one pad token each before the processor expands it
    unexpanded = len(processor.tokenizer(prompt)["input_ids"])
    text = visible_text(processor.tokenizer, generated)
    return Answer(ids, generated, text, len(ids) - unexpanded + placeholders, margin)


def visible_text(tokenizer, ids: list[int]) -> str:
    """The answer's text as a detokenizer that streams shows it: text ending in an incomplete UTF-8 sequence
    (decoded as U+FFFD) is held back until a later token completes it, so a final incomplete one never shows
    (vLLM's rule; a tiny random model often ends on half a character)."""
    for end in range(len(ids), -1, -1):
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            return text
    return ""
