"""What callers of Omni / AsyncOmni receive, and how the orchestrator builds it from a stage's
deltas (streamed updates) and its assembled whole (the stage's last update)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from omnistage.modality import OutputModality


@dataclass
class OmniRequestOutput:
    """One update of one request from one final stage.

    Streamed updates (``finished=False``) carry only what is new: ``delta`` (this update's payload,
    e.g. ``{"text": " world"}`` or ``{"audio": chunk}``), ``progress`` and the running token counts.
    The stage's last update (``finished=True``) carries the whole output in the typed fields
    (``text``, ``images``, ``audio``, ...), assembled once, plus ``finish_reason`` and ``metrics``.
    """

    request_id: str
    stage_id: int
    final_output_type: str
    finished: bool
    text: str | None = None
    token_ids: list[int] | None = None
    images: list[Any] = field(default_factory=list)  # PIL.Image.Image
    audio: np.ndarray | None = None  # float32 [samples], or [2, samples] for stereo (LTX-2's soundtrack)
    sample_rate: int | None = None
    video: np.ndarray | None = None  # uint8 [T, H, W, 3]
    fps: float | None = None
    latents: Any = None
    actions: torch.Tensor | None = None  # float32 [steps, action width] (a world model's action chunk)
    action_domain: str | None = None  # the embodiment the actions are for (e.g. "av", "bridge_orig_lerobot")
    action_fps: float | None = None  # action steps per second
    revised_prompt: str | None = None  # the prompt the stage drew from when it rewrote the caller's (a prompt enhancer)
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None  # finished outputs of llm stages
    num_prompt_tokens: int | None = None
    num_tokens: int | None = None  # tokens generated so far by this (llm) stage
    delta: dict[str, Any] = field(default_factory=dict)
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)  # stage id -> StageMetrics.to_dict()
    progress: tuple[int, int] | None = None
    error: str | None = None

    @property
    def modalities(self) -> list[str]:
        have = {
            "text": self.text,
            "token_ids": self.token_ids,
            "image": self.images or None,
            "audio": self.audio,
            "video": self.video,
            "latent": self.latents,
            "action": self.actions,
        }
        return [k for k, v in have.items() if v is not None]


_PAYLOAD_KEYS = frozenset({"text", "token_ids", "image", "audio", "video", "latent", "action"})


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


def audio_array(x: Any) -> np.ndarray:
    """A stage's audio payload as float32 [samples] (mono), or [2, samples] when it is stereo."""
    arr = _numpy(x, np.float32)
    return arr if arr.ndim == 2 and arr.shape[0] == 2 else arr.reshape(-1)


def action_tensor(x: Any) -> torch.Tensor:
    """A stage's action payload as a float32 [steps, action width] tensor on the CPU."""
    t = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.ndim != 2:
        raise ValueError(f"action payload must be [steps, action width], got shape {tuple(t.shape)}")
    return t.to(torch.float32)


def _ids(x: Any) -> list[int]:
    return x.tolist() if isinstance(x, (torch.Tensor, np.ndarray)) else [int(i) for i in x]


@functools.cache
def dropped_keys(keep: OutputModality) -> frozenset[str]:
    """Payload keys the caller did not ask for (computed once per modality set: used per streamed delta)."""
    return frozenset(k for k in _PAYLOAD_KEYS if not OutputModality.parse(k) & keep)


def delta_output(
    *,
    request_id: str,
    stage_id: int,
    output_type: OutputModality,
    delta: dict[str, Any],
    keep: OutputModality,
    progress: tuple[int, int] | None,
    num_tokens: int | None,
    num_prompt_tokens: int | None,
) -> OmniRequestOutput:
    """A streamed update: only this update's payload (no copy of what came before)."""
    dropped = dropped_keys(keep)
    return OmniRequestOutput(
        request_id=request_id,
        stage_id=stage_id,
        final_output_type=str(output_type),
        finished=False,
        delta={k: v for k, v in delta.items() if k not in dropped},
        progress=progress,
        num_tokens=num_tokens,
        num_prompt_tokens=num_prompt_tokens,
        sample_rate=delta.get("sample_rate"),
        fps=delta.get("fps"),
    )


def final_output(
    *,
    request_id: str,
    stage_id: int,
    output_type: OutputModality,
    whole: dict[str, Any],
    keep: OutputModality,
    metrics: dict,
    finish_reason: str | None,
    num_tokens: int | None,
    progress: tuple[int, int] | None,
) -> OmniRequestOutput:
    """A stage's last update: its whole output (only the modalities the caller asked for)."""
    out = OmniRequestOutput(
        request_id=request_id,
        stage_id=stage_id,
        final_output_type=str(output_type),
        finished=True,
        metrics=metrics,
        progress=progress,
        finish_reason=finish_reason,
        num_tokens=num_tokens,
    )
    if OutputModality.TEXT in keep and "text" in whole:
        out.text = whole["text"]
    if OutputModality.TOKEN_IDS in keep and "token_ids" in whole:
        out.token_ids = _ids(whole["token_ids"])
    if OutputModality.IMAGE in keep and "image" in whole:
        out.images = [to_pil(im) for im in whole["image"]]
    if OutputModality.AUDIO in keep and "audio" in whole:
        out.audio = audio_array(whole["audio"])
        out.sample_rate = whole.get("sample_rate")
    if OutputModality.VIDEO in keep and "video" in whole:
        out.video = _numpy(whole["video"], np.uint8)
        out.fps = whole.get("fps")
    if OutputModality.LATENT in keep and "latent" in whole:
        out.latents = whole["latent"]
    if OutputModality.ACTION in keep and "action" in whole:
        out.actions = action_tensor(whole["action"])
        out.action_domain = whole.get("action_domain")
        out.action_fps = whole.get("action_fps")
    if whole.get("revised_prompt") is not None:
        out.revised_prompt = str(whole["revised_prompt"])
    if "prompt_token_ids" in whole:
        out.prompt_token_ids = _ids(whole["prompt_token_ids"])
        out.num_prompt_tokens = len(out.prompt_token_ids)
    return out
