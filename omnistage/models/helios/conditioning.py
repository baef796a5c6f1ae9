"""Helios image-to-video and video-to-video: the input's latents, noised, as HeliosPipeline makes them.

An input image becomes the video's first-frame prefix (its VAE latent) and the last frame of the history (the
last latent of the image repeated over one chunk's frames); an input video becomes the first-frame prefix (its
first frame's latent) and the history (its last whole chunks' latents). Both are noised with sigmas drawn from
the request's generator, in the pipeline's order, before the first chunk's noise. The pipeline's defaults for
the noise (on, sigmas in [0.111, 0.135]) are the only ones served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diffusers.utils.torch_utils import randn_tensor

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.video_frames import rgb_frames

SIGMAS = (0.111, 0.135)  # HeliosPipeline.__call__'s image_noise_sigma_* and video_noise_sigma_* defaults
VIDEO = "multi_modal_data.video"
IMAGE = "multi_modal_data.image"


@dataclass
class InputLatents:
    """What an input image or video puts into a request's first chunk."""

    prefix: torch.Tensor  # fp32 [1, C, 1, h, w]: the short history's first-frame prefix
    history: torch.Tensor  # fp32 [1, C, T, h, w]: the latest history latent frames
    generated: int  # latent frames the pipeline counts as made (its latent output includes them)


def input_video(job: Any, window: int) -> list[Any] | None:
    """``multi_modal_data.video`` as a list of PIL frames (HeliosPipeline resizes PIL frames with PIL), checked:
    RGB frames, at least one chunk of ``window`` of them (the pipeline encodes whole chunks)."""
    mm = job.inputs.get("multi_modal_data") or {}
    video = mm.get("video") if isinstance(mm, dict) else None
    if video is None:
        return None
    out = rgb_frames(video, VIDEO)
    if len(out) < window:
        raise InvalidRequestError(
            VIDEO, f"{len(out)} frames; Helios encodes an input video in chunks of {window}: send at least {window}"
        )
    return out


def _sigma(generator: torch.Generator, device: torch.device, size: int = 1) -> torch.Tensor:
    lo, hi = SIGMAS
    return torch.rand(size, device=device, generator=generator) * (hi - lo) + lo


def _noised(x: torch.Tensor, sigma: torch.Tensor, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return sigma * randn_tensor(x.shape, generator=generator, device=device) + (1 - sigma) * x


def image_latents(pipe: Any, job: Any, chunk: int, stats: tuple, device: torch.device) -> InputLatents:
    """The input image's prefix and history latent (HeliosPipeline's ``prepare_image_latents`` and noise)."""
    g = job.generator
    image = pipe.video_processor.preprocess(job.images[0], height=job.height, width=job.width)
    prefix, fake = pipe.prepare_image_latents(
        image, *stats, num_latent_frames_per_chunk=chunk, dtype=torch.float32, device=device, generator=g
    )
    prefix = _noised(prefix, _sigma(g, device), g, device)
    fake = _noised(fake, _sigma(g, device), g, device)
    return InputLatents(prefix, fake, 1)


def video_latents(pipe: Any, job: Any, frames: list[Any], chunk: int, stats: tuple, device: torch.device) -> Any:
    """The input video's prefix and history latents (HeliosPipeline's ``prepare_video_latents`` and its
    per-frame noise, chunk by chunk)."""
    g = job.generator
    video = pipe.video_processor.preprocess_video(frames, height=job.height, width=job.width)
    prefix, latents = pipe.prepare_video_latents(
        video, *stats, num_latent_frames_per_chunk=chunk, dtype=torch.float32, device=device, generator=g
    )
    prefix = _noised(prefix, _sigma(g, device), g, device)
    noised = []
    for part in latents.split(chunk, dim=2):
        sigmas = _sigma(g, device, part.shape[2]).view(1, 1, part.shape[2], 1, 1)
        noised.append(_noised(part, sigmas, g, device))
    latents = torch.cat(noised, dim=2)
    return InputLatents(prefix, latents, latents.shape[2])
