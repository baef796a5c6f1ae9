"""Benchmark request lists: ``random`` (seeded, synthetic) and ``custom`` (JSONL)."""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

TASKS = ("t2i", "i2i", "t2v", "i2v", "tts", "chat", "omni", "asr")  # omni: chat answered in text + speech; asr: a
# clip to /v1/audio/transcriptions
IMAGE_INPUT_TASKS = ("i2i", "i2v")
AUDIO_INPUT_TASKS = ("chat", "omni", "asr")  # chat / omni: an input_audio part (--chat-audio, custom "audio")
ASR_DEFAULT_AUDIO_S = 5.0  # asr without --chat-audio

# A small fixed vocabulary: prompts are reproducible and readable in logs.
_WORDS = (
    "red blue green yellow purple orange small large round square circle triangle star "
    "cat dog bird tree house river mountain city night morning sunset ocean forest cloud "
    "painting photo sketch bright dark soft sharp old new quiet busy happy calm wooden stone"
).split()


@dataclass
class BenchRequest:
    """One request of the benchmark; fields a task does not use are ignored."""

    request_id: str
    prompt: str
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    negative_prompt: str | None = None
    image: bytes | None = None  # PNG bytes for i2i / i2v (and chat with --chat-image: an image_url part)
    audio: bytes | None = None  # WAV bytes: chat / omni with --chat-audio (an input_audio part)
    max_tokens: int | None = None  # chat
    voice: str | None = None  # tts
    slo_s: float | None = None  # per-request SLO (custom datasets); else the run's SLO
    extra: dict[str, Any] = field(default_factory=dict)  # merged into the request body

    def with_steps(self, steps: int | None) -> BenchRequest:
        return replace(self, num_inference_steps=steps)


@dataclass
class DatasetDefaults:
    """Values from the command line; custom JSONL lines override them per request."""

    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = 0
    max_tokens: int | None = None
    voice: str | None = None
    input_len: int = 16  # random prompts: words per prompt
    chat_image: bool = False  # chat: one seeded random PNG (width x height, default 64x64) per request
    chat_audio_s: float | None = None  # chat / omni: one seeded WAV clip of this many seconds per request


def random_image_png(width: int, height: int, seed: int) -> bytes:
    """A seeded noise image, encoded as PNG (input for i2i / i2v)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


AUDIO_RATE = 16000  # the rate speech encoders (Whisper-style feature extractors) take: no resampling


def random_audio(seconds: float, seed: int, rate: int = AUDIO_RATE):
    """A seeded tone with a little noise, float32 in [-1, 1) and an exact multiple of 1/32768, so a 16-bit WAV
    of it decodes back to the very same samples (a benchmark can hand the array to a baseline)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * (220 + 55 * (seed % 8)) * t) + 0.05 * rng.standard_normal(t.shape)
    return (np.round(np.clip(x, -1, 1 - 1 / 32768) * 32768) / 32768).astype(np.float32)


def wav_bytes(samples, rate: int = AUDIO_RATE) -> bytes:
    """Mono 16-bit PCM WAV of float samples in [-1, 1) (the stdlib writer: no audio library needed)."""
    import wave

    import numpy as np

    pcm = np.round(np.asarray(samples, dtype=np.float64) * 32768).clip(-32768, 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def random_dataset(task: str, num_prompts: int, defaults: DatasetDefaults) -> list[BenchRequest]:
    _check_task(task)
    base_seed = defaults.seed or 0
    rng = random.Random(base_seed)
    out = []
    for i in range(num_prompts):
        words = defaults.input_len if task in ("chat", "omni") else rng.randint(4, 12)
        prompt = " ".join(rng.choice(_WORDS) for _ in range(max(1, words)))
        req = _from_defaults(f"bench-{i}", prompt, defaults, seed=base_seed + i)
        if task in IMAGE_INPUT_TASKS or (task == "chat" and defaults.chat_image):
            req.image = random_image_png(req.width or 64, req.height or 64, base_seed + i)
        seconds = defaults.chat_audio_s or (ASR_DEFAULT_AUDIO_S if task == "asr" else None)
        if task in AUDIO_INPUT_TASKS and seconds:
            req.audio = wav_bytes(random_audio(seconds, base_seed + i))
        out.append(req)
    return out


_CUSTOM_KEYS = {
    "prompt",
    "width",
    "height",
    "num_frames",
    "num_inference_steps",
    "guidance_scale",
    "seed",
    "negative_prompt",
    "image",
    "audio",
    "max_tokens",
    "voice",
    "slo_s",
    "extra",
}


def custom_dataset(path: str | Path, task: str, num_prompts: int, defaults: DatasetDefaults) -> list[BenchRequest]:
    """JSONL, one object per line: ``{"prompt": ..., "image": "file.png", "seed": 3, ...}``.

    ``image`` (and ``audio``: a WAV file, chat / omni) paths are relative to the JSONL file. Unknown keys are errors.
    """
    _check_task(task)
    path = Path(path)
    out: list[BenchRequest] = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{where}: each line must be a JSON object")
        unknown = sorted(set(row) - _CUSTOM_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(_CUSTOM_KEYS)}")
        if not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        if "extra" in row and not isinstance(row["extra"], dict):
            raise ValueError(f"{where}: 'extra' must be an object")
        seed = row.get("seed", (defaults.seed or 0) + len(out))
        req = _from_defaults(f"bench-{len(out)}", row["prompt"], defaults, seed=seed)
        for key in (
            "width",
            "height",
            "num_frames",
            "num_inference_steps",
            "guidance_scale",
            "negative_prompt",
            "max_tokens",
            "voice",
            "slo_s",
            "extra",
        ):
            if key in row:
                setattr(req, key, row[key])
        if "image" in row:
            img_path = path.parent / row["image"]
            if not img_path.is_file():
                raise ValueError(f"{where}: 'image' file not found: {img_path}")
            req.image = img_path.read_bytes()
        elif task in IMAGE_INPUT_TASKS:
            raise ValueError(f"{where}: task {task} needs an 'image' path")
        if "audio" in row:
            if task not in AUDIO_INPUT_TASKS:
                raise ValueError(f"{where}: 'audio' is for tasks {', '.join(AUDIO_INPUT_TASKS)}, not {task}")
            audio_path = path.parent / row["audio"]
            if not audio_path.is_file():
                raise ValueError(f"{where}: 'audio' file not found: {audio_path}")
            req.audio = audio_path.read_bytes()
        elif task in AUDIO_INPUT_TASKS and (defaults.chat_audio_s or task == "asr"):
            req.audio = wav_bytes(random_audio(defaults.chat_audio_s or ASR_DEFAULT_AUDIO_S, seed))
        out.append(req)
        if len(out) >= num_prompts:
            break
    if not out:
        raise ValueError(f"{path}: no requests")
    return out


def load_dataset(
    name: str, task: str, num_prompts: int, defaults: DatasetDefaults, path: str | None = None
) -> list[BenchRequest]:
    if num_prompts < 1:
        raise ValueError("--num-prompts must be at least 1")
    if name == "random":
        return random_dataset(task, num_prompts, defaults)
    if name == "custom":
        if not path:
            raise ValueError("--dataset custom needs --dataset-path FILE.jsonl")
        return custom_dataset(path, task, num_prompts, defaults)
    raise ValueError(f"unknown --dataset {name!r}; choose random or custom")


def _from_defaults(request_id: str, prompt: str, d: DatasetDefaults, seed: int | None) -> BenchRequest:
    return BenchRequest(
        request_id=request_id,
        prompt=prompt,
        width=d.width,
        height=d.height,
        num_frames=d.num_frames,
        num_inference_steps=d.num_inference_steps,
        guidance_scale=d.guidance_scale,
        seed=seed,
        max_tokens=d.max_tokens,
        voice=d.voice,
    )


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown --task {task!r}; choose one of {', '.join(TASKS)}")
