"""Frames a request brings in ``multi_modal_data`` (an input video, a mask video, reference pictures) as RGB PIL
images: what diffusers' video processors resize with PIL, and what they read a frame's size from (for a numpy
frame ``VideoProcessor.get_default_height_width`` reads the wrong axes)."""

from __future__ import annotations

from typing import Any

import numpy as np


def rgb_frames(value: Any, field: str) -> list[Any]:
    """``value`` (a list of PIL images or uint8 ``HxWx3`` / ``HxW`` arrays, or one uint8 ``[T, H, W, 3]`` array, as
    the server's media intake decodes a video) as RGB PIL frames; a frame of another kind is refused naming
    ``field[i]``, an empty clip naming ``field``."""
    from PIL import Image

    from omnistage.errors import InvalidRequestError

    if isinstance(value, Image.Image):
        value = [value]
    if isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim == 4):
        frames = list(value)
    else:
        raise InvalidRequestError(
            field, f"expected a list of frames or a uint8 [T, H, W, 3] array, got {type(value).__name__}"
        )
    if not frames:
        raise InvalidRequestError(field, "no frames")
    out = []
    for i, f in enumerate(frames):
        if isinstance(f, Image.Image):
            out.append(f.convert("RGB"))
            continue
        arr = np.asarray(f)
        if arr.dtype != np.uint8 or not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] == 3)) or 0 in arr.shape:
            raise InvalidRequestError(f"{field}[{i}]", "expected an RGB frame (PIL, uint8 HxWx3 or HxW)")
        out.append(Image.fromarray(arr).convert("RGB"))
    return out


def check_one_video(params: Any) -> None:
    """A video request makes one video: several outputs are several requests (they share the forwards)."""
    from omnistage.errors import InvalidRequestError

    if params.num_outputs_per_prompt != 1:
        raise InvalidRequestError(
            "num_outputs_per_prompt",
            f"{params.num_outputs_per_prompt}; a video request makes "
            "one video (send several requests: they share the forwards)",
        )
