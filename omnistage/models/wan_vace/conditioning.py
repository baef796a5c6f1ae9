"""What a Wan VACE request conditions on: a source video, its mask and reference pictures, read from
``multi_modal_data`` and checked, and the control latents ``WanVACEPipeline.__call__`` makes of them (with the
pipeline's own ``preprocess_conditions`` / ``prepare_video_latents`` / ``prepare_masks``, so they are the same).

Every input is optional, as in the pipeline: no video is an all-zero one of the request's size and length, no mask
regenerates every pixel (white: regenerate, black: keep), no reference pictures none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.video_frames import rgb_frames

VIDEO = "multi_modal_data.video"
MASK = "multi_modal_data.mask"
REFERENCES = "multi_modal_data.reference_images"


@dataclass
class VaceInputs:
    video: list[Any] | None = None  # RGB PIL frames
    mask: list[Any] | None = None  # RGB PIL frames, as many and as large as the video's
    references: list[Any] = field(default_factory=list)  # RGB PIL pictures


def read_inputs(job: Any) -> VaceInputs:
    """The request's video, mask and reference pictures, checked: a mask needs a video of as many frames of its
    size. Reference pictures come as ``reference_images`` (or as ``image``, the field the HTTP routes fill from an
    uploaded reference picture), not both."""
    mm = job.inputs.get("multi_modal_data") or {}
    got = VaceInputs()
    if mm.get("video") is not None:
        got.video = rgb_frames(mm["video"], VIDEO)
    if mm.get("mask") is not None:
        got.mask = rgb_frames(mm["mask"], MASK)
        if got.video is None:
            raise InvalidRequestError(MASK, "a mask needs the video it masks (multi_modal_data.video)")
        if len(got.mask) != len(got.video):
            raise InvalidRequestError(MASK, f"{len(got.mask)} frames; the video has {len(got.video)}")
        sizes = {f.size for f in got.mask}
        if sizes != {got.video[0].size}:
            w, h = got.video[0].size
            raise InvalidRequestError(MASK, f"frames of {_sizes(sizes)}; the video's are {w}x{h}")
    if mm.get("reference_images") is not None:
        if job.images:
            raise InvalidRequestError(REFERENCES, "send reference pictures as reference_images or image, not both")
        got.references = rgb_frames(mm["reference_images"], REFERENCES)
    elif job.images:
        got.references = list(job.images)
    return got


def _sizes(sizes: set[tuple[int, int]]) -> str:
    return ", ".join(f"{w}x{h}" for w, h in sorted(sizes))


def control_size(pipe: Any, video: list[Any] | None, height: int, width: int, base: int) -> tuple[int, int]:
    """The size the pipeline encodes the video at (``preprocess_conditions``): its own, shrunk to the request's
    area when larger, floored to ``base`` (VAE factor x patch); the request's size when there is no video."""
    if video is None:
        return height, width
    vh, vw = pipe.video_processor.get_default_height_width(video[0])
    if vh * vw > height * width:
        scale = min(width / vw, height / vh)
        vh, vw = int(vh * scale), int(vw * scale)
    vh, vw = vh // base * base, vw // base * base
    if not vh or not vw:
        raise InvalidRequestError(VIDEO, f"frames of {video[0].width}x{video[0].height} are smaller than {base} pixels")
    return vh, vw


def control_latents(pipe: Any, job: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[1, 96, T, h, w] in ``dtype``: the video's inactive and reactive latents and the folded mask, reference
    pictures' latents first, as ``WanVACEPipeline.__call__`` builds ``conditioning_latents``."""
    video, mask, refs = pipe.preprocess_conditions(
        job.vace.video,
        job.vace.mask,
        job.vace.references or None,
        1,
        job.height,
        job.width,
        job.num_frames,
        torch.float32,
        device,
    )
    latents = pipe.prepare_video_latents(video, mask, refs, job.generator, device)
    mask = pipe.prepare_masks(mask, refs, job.generator)
    return torch.cat([latents, mask], dim=1).to(dtype)
