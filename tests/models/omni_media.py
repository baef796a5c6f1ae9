"""Small real media for the omni-model tests (Qwen3-Omni, Qwen2.5-Omni, chat), made so both sides decode them
to the same values: PCM16 WAV clips whose float samples are exact multiples of 1/32768 (a WAV round trip is lossless),
PNG images, and uint8 video frames."""

from __future__ import annotations

import base64
import io

import numpy as np

RATE = 16000  # the feature extractor's rate: no resampling on either side


def clip(seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    x = 0.3 * np.sin(2 * np.pi * (220 + 220 * seed) * t) + 0.05 * rng.standard_normal(t.shape)
    return (np.round(np.clip(x, -1, 1 - 1 / 32768) * 32768) / 32768).astype(np.float32)


def wav_base64(x: np.ndarray) -> str:
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, x, RATE, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode()


def image(seed: int = 0, size: int = 64):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(100 + seed).integers(0, 255, (size, size, 3), dtype=np.uint8))


def png_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def frames(n: int = 4, seed: int = 0, size: int = 64) -> np.ndarray:
    return np.random.default_rng(200 + seed).integers(0, 255, (n, size, size, 3), dtype=np.uint8)
