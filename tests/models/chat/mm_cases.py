"""Multimodal chat cases for the tiny ``vlm`` (Idefics3), ``audio_lm`` (Qwen2-Audio) and
``qwen2_5_vl`` / ``qwen3_vl`` (images and video) fixtures, shared by the engine, fixture and HTTP
tests, and vLLM's own answers to them (``LLM.chat`` / ``LLM.generate`` on the same folder),
computed once per test session."""

from __future__ import annotations

import base64
import functools
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnistage.testing.run_cache import shared
from tests.models.offline_llm import offline_llm

ENGINE = {"max_model_len": 1024, "max_num_seqs": 4, "dtype": "float32", "enforce_eager": True}
GREEDY = {"temperature": 0.0, "max_tokens": 12}
LIMITS = {"image": 2}  # the VLM's limit_mm_per_prompt in every engine and server under test
VL_LIMITS = {"image": 2, "video": 1}  # the same for the Qwen VL fixtures
VL_FAMILIES = ("qwen2_5_vl", "qwen3_vl")
SAMPLE_RATE = 16000


def png(seed: int, width: int, height: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def wav(seconds: float, hz: float) -> bytes:
    import soundfile as sf

    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def frames(seed: int, count: int, width: int, height: int) -> np.ndarray:
    """uint8 [T, H, W, 3]: smooth colour ramps that move from frame to frame (noise would compress badly)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = rng.integers(0, 256, size=3)
    out = [(base + np.stack([x * 3 + 20 * t, y * 3 - 15 * t, (x + y) * 2 + 25 * t], -1)) % 256 for t in range(count)]
    return np.stack(out).astype(np.uint8)


def mp4(data: np.ndarray, fps: float) -> bytes:
    """A real H.264 MP4 (PyAV), as a client would send it."""
    from omnistage.server.media import encode_mp4

    return encode_mp4(data, fps)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def image_part(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(data)}}


def audio_part(data: bytes) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": "wav"}}


def video_part(data: bytes) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64(data)}}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


IMG_A, IMG_B, IMG_C = png(1, 64, 48), png(2, 40, 40), png(3, 30, 60)  # 2x2, 2x2 and 1x2 tiles
CLIP = wav(0.7, 440.0)
# 2 s clips; vLLM's loader samples the frames (both sides of every comparison use the same bytes)
VID_A, VID_B = mp4(frames(4, 8, 84, 56), 4), mp4(frames(5, 6, 56, 56), 3)


@dataclass
class Case:
    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    mm_processor_kwargs: dict[str, Any] | None = None

    def chat_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``LLM.chat`` (and the same fields of an HTTP request body)."""
        kw: dict[str, Any] = {
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
        }
        if self.chat_template_kwargs:
            kw["chat_template_kwargs"] = self.chat_template_kwargs
        if self.mm_processor_kwargs:
            kw["mm_processor_kwargs"] = self.mm_processor_kwargs
        return kw

    def omni_prompt(self) -> dict[str, Any]:
        """The same conversation as an ``AsyncOmni`` / ``Omni`` prompt."""
        prompt: dict[str, Any] = {
            "messages": self.messages,
            "chat_template_kwargs": {
                **self.chat_template_kwargs,
                "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message,
            },
        }
        if self.mm_processor_kwargs:
            prompt["mm_processor_kwargs"] = self.mm_processor_kwargs
        return prompt


VLM_CASES = {
    "one_image": Case([{"role": "user", "content": [image_part(IMG_A), text("describe the picture")]}]),
    "two_images": Case(
        [{"role": "user", "content": [text("compare"), image_part(IMG_A), text("with"), image_part(IMG_B)]}]
    ),
    "earlier_turn": Case(
        [
            {"role": "user", "content": [image_part(IMG_C), text("what is this?")]},
            {"role": "assistant", "content": "a red cat"},
            {"role": "user", "content": "and the colour of the sky?"},
        ]
    ),
    "system_vision_ids": Case(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [image_part(IMG_B), image_part(IMG_C), text("which one?")]},
        ],
        chat_template_kwargs={"add_vision_id": True},
    ),
    "continue_final": Case(
        [
            {"role": "user", "content": [image_part(IMG_A), text("describe")]},
            {"role": "assistant", "content": "the picture shows"},
        ],
        add_generation_prompt=False,
        continue_final_message=True,
    ),
    "no_splitting": Case(
        [{"role": "user", "content": [image_part(IMG_A), text("describe the picture")]}],
        mm_processor_kwargs={"do_image_splitting": False},
    ),
}
VL_CASES = {  # for qwen2_5_vl and qwen3_vl
    "one_image": Case([{"role": "user", "content": [image_part(IMG_A), text("describe the picture")]}]),
    "one_video": Case([{"role": "user", "content": [video_part(VID_A), text("what happens?")]}]),
    "image_and_video": Case(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [text("compare"), image_part(IMG_C), text("with"), video_part(VID_B)]},
        ]
    ),
    "two_images_vision_ids": Case(
        [{"role": "user", "content": [image_part(IMG_A), image_part(IMG_B), text("which one?")]}],
        chat_template_kwargs={"add_vision_id": True},
    ),
    "video_in_earlier_turn": Case(
        [
            {"role": "user", "content": [video_part(VID_B), text("what is this?")]},
            {"role": "assistant", "content": "a red cat"},
            {"role": "user", "content": "and the colour of the sky?"},
        ]
    ),
}
AUDIO_CASES = {
    "one_clip": Case([{"role": "user", "content": [audio_part(CLIP), text("what is this sound")]}]),
    "clip_in_earlier_turn": Case(
        [
            {"role": "user", "content": [text("listen"), audio_part(CLIP)]},
            {"role": "assistant", "content": "a tone"},
            {"role": "user", "content": "how high?"},
        ]
    ),
}


def image(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def audio(data: bytes) -> tuple[np.ndarray, int]:
    import soundfile as sf

    arr, sr = sf.read(io.BytesIO(data), dtype="float32")
    return arr, sr


# The offline prompt form, as LLM.generate takes it: the model's placeholders are in the text.
VLM_RAW = {
    "prompt": "<|im_start|>user\n<image>a cat?<|im_end|>\n<|im_start|>assistant\n",
    "multi_modal_data": {"image": image(IMG_B)},
}
AUDIO_RAW = {
    "prompt": "<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nhi<|im_end|>\n<|im_start|>assistant\n",
    "multi_modal_data": {"audio": audio(CLIP)},
}
# Offline video: decoded frames with the metadata Qwen's processors need (the frames' rate and
# which source frames they are); do_sample_frames=False: these are the frames the model sees.
FRAMES = frames(6, 4, 84, 56)
FRAMES_META = {
    "fps": 2.0,
    "duration": 2.0,
    "total_num_frames": 4,
    "frames_indices": [0, 1, 2, 3],
    "video_backend": "opencv",
    "do_sample_frames": False,
}
_QWEN_USER = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
VL_RAW = {
    "raw_image": {
        "prompt": _QWEN_USER.format("<|vision_start|><|image_pad|><|vision_end|>a cat?"),
        "multi_modal_data": {"image": image(IMG_B)},
    },
    "raw_frames": {
        "prompt": _QWEN_USER.format("<|vision_start|><|video_pad|><|vision_end|>what moves?"),
        "multi_modal_data": {"video": (FRAMES, FRAMES_META)},
    },
    "raw_image_and_frames": {
        "prompt": _QWEN_USER.format(
            "<|vision_start|><|image_pad|><|vision_end|> and <|vision_start|><|video_pad|><|vision_end|>"
        ),
        "multi_modal_data": {"image": [image(IMG_A)], "video": [(FRAMES, FRAMES_META)]},
    },
}
# family -> (chat cases, LLM.generate prompts by name, limit_mm_per_prompt)
FAMILIES = {
    "vlm": (VLM_CASES, {"raw": VLM_RAW}, LIMITS),
    "audio_lm": (AUDIO_CASES, {"raw": AUDIO_RAW}, None),
    **{f: (VL_CASES, VL_RAW, VL_LIMITS) for f in VL_FAMILIES},
}


@dataclass
class Answer:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str


@functools.cache
def vllm_answers(folder: str, family: str) -> dict[str, Answer]:
    """vLLM's own greedy answers for every case of ``family`` (a key of ``FAMILIES``) and for its
    raw prompts, by name; the engine is shut down before this returns. Computed once per test run, for both
    xdist workers (omnistage/testing/run_cache.py)."""
    return shared(f"chat-mm-vllm-answers-{family}", lambda: _vllm_answers(folder, family))


def _vllm_answers(folder: str, family: str) -> dict[str, Answer]:
    from vllm import SamplingParams

    cases, raw, limits = FAMILIES[family]
    with offline_llm(folder, limit_mm_per_prompt=limits, **ENGINE) as llm:
        sp = SamplingParams(**GREEDY)
        out = {}
        for name, case in cases.items():
            ro = llm.chat(case.messages, sp, use_tqdm=False, **case.chat_kwargs())[0]
            out[name] = Answer(list(ro.prompt_token_ids), list(ro.outputs[0].token_ids), ro.outputs[0].text)
        for name, prompt in raw.items():
            ro = llm.generate(prompt, sp, use_tqdm=False)[0]
            out[name] = Answer(list(ro.prompt_token_ids), list(ro.outputs[0].token_ids), ro.outputs[0].text)
    return out
