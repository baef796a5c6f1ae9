"""Turn a stage's accumulated payloads into the caller's OmniRequestOutput."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from PIL import Image

from omnistage.modality import OutputModality
from omnistage.outputs import OmniRequestOutput


def to_pil(image: Any) -> Image.Image:
    """uint8 HWC arrays / tensors and PIL images become PIL images."""
    if isinstance(image, Image.Image):
        return image
    arr = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    if arr.dtype != np.uint8:
        raise TypeError(f"image payload must be uint8 HxWxC, got {arr.dtype}")
    return Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr)


def _numpy(x: Any, dtype: Any) -> np.ndarray:
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    return arr.astype(dtype, copy=False)


def _ids(x: Any) -> list[int]:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return x.tolist()
    if type(x) is list and (not x or type(x[-1]) is int):  # the llm stage's own lists: copy at C speed
        return list(x)
    return [int(i) for i in x]


_PAYLOAD_KEYS = frozenset({"text", "token_ids", "image", "audio", "video", "latent"})


@functools.lru_cache(maxsize=None)
def _dropped(keep: OutputModality) -> frozenset[str]:
    """Payload keys the caller did not ask for (computed once per modality set: called per streamed chunk)."""
    return frozenset(k for k in _PAYLOAD_KEYS if not OutputModality.parse(k) & keep)


def to_request_output(*, request_id: str, stage_id: int, output_type: OutputModality, total: dict[str, Any],
                      delta: dict[str, Any], finished: bool, metrics: dict, progress, keep: OutputModality) -> OmniRequestOutput:
    """``keep`` is the subset of modalities the caller asked for; the rest is not returned."""
    out = OmniRequestOutput(request_id=request_id, stage_id=stage_id, final_output_type=str(output_type),
                            finished=finished, metrics=metrics, progress=progress,
                            finish_reason=total.get("finish_reason"), num_tokens=total.get("num_tokens"))
    if OutputModality.TEXT in keep and "text" in total:
        out.text = total["text"]
    if OutputModality.TOKEN_IDS in keep and "token_ids" in total:
        out.token_ids = _ids(total["token_ids"])
    if OutputModality.IMAGE in keep and "image" in total:
        out.images = [to_pil(im) for im in total["image"]]
    if OutputModality.AUDIO in keep and "audio" in total:
        out.audio = _numpy(total["audio"], np.float32).reshape(-1)
        out.sample_rate = total.get("sample_rate")
    if OutputModality.VIDEO in keep and "video" in total:
        out.video = _numpy(total["video"], np.uint8)
        out.fps = total.get("fps")
    if OutputModality.LATENT in keep and "latent" in total:
        out.latents = total["latent"]
    dropped = _dropped(keep)
    out.delta = {k: v for k, v in delta.items() if k not in dropped}
    if "prompt_token_ids" in total:
        out.prompt_token_ids = _ids(total["prompt_token_ids"])
    return out
