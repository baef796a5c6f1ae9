"""PNG helpers the image HTTP tests share: decode a ``b64_json`` answer, encode an upload, and the one-uint8-level
comparison with diffusers' own images (PNG is lossless; the level is the rounding of float pixels to uint8)."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image


def decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def within_one_level(got: np.ndarray, want: Image.Image) -> bool:
    want = np.asarray(want)
    return got.shape == want.shape and int(np.abs(got.astype(int) - want.astype(int)).max()) <= 1
