"""Wan VACE (``WanVACEPipeline``) for the diffusion engine: Wan's text-to-video loop
(``omnistage/models/shared/wan_adapter.py``) whose DiT also takes VACE hints of a control input: a source video, its
mask and reference pictures (conditioning.py), encoded once per request.

Mirrors ``WanVACEPipeline.__call__`` so that one request alone reproduces it exactly: the control latents from the
pipeline's own helpers, then the noise from the request's generator (over the video's latent frames plus one per
reference picture), UniPC stepped per request, cond and uncond as separate forwards, and the reference pictures'
latent frames dropped before decoding. Requests share a forward when their latent and control shapes agree; each row
carries its own ``conditioning_scale`` (the DiT multiplies each hint by it, so a per-row scale is the same product).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.wan_adapter import DEFAULT_HEIGHT, DEFAULT_NUM_FRAMES, DEFAULT_WIDTH, WanAdapter, WanJob
from omnistage.models.wan_vace.conditioning import VIDEO, VaceInputs, control_latents, control_size, read_inputs
from omnistage.stages.diffusion.blocks import BlockLayout


@dataclass
class WanVaceJob(WanJob):
    """A request's VACE state, set in validate."""

    vace: VaceInputs = field(default_factory=VaceInputs)
    scale: list[float] = field(default_factory=list)  # conditioning_scale, one per VACE layer
    control_shape: tuple[int, int, int] = (0, 0, 0)  # the control latents' frames, height and width


class WanVaceAdapter(WanAdapter):
    job_class = WanVaceJob
    pipeline_class_name = "WanVACEPipeline"
    variants: ClassVar[dict] = {}  # (not Wan's image-to-video)

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        self.vace_layers = len(model.config.vace_layers)

    def validate(self, job: WanVaceJob) -> None:
        job.vace = read_inputs(job)
        if job.params.strength is not None:
            raise InvalidRequestError("strength", "not used by Wan VACE (the mask says what to regenerate)")
        job.scale = self._scale(job.params.extra_args.get("conditioning_scale", 1.0))
        # with a source video, the size and length default to its own (the pipeline's defaults otherwise)
        size, frames = (DEFAULT_HEIGHT, DEFAULT_WIDTH), DEFAULT_NUM_FRAMES
        base = self.pipe.vae_scale_factor_spatial * self.patch[1]
        video = job.vace.video
        if video is not None:
            w, h = video[0].size
            size, frames = (max(h // base, 1) * base, max(w // base, 1) * base), len(video)
        self.validate_video(job, size, frames)
        vh, vw = control_size(self.pipe, video, job.height, job.width, base)
        ft = self.pipe.vae_scale_factor_temporal
        made = job.num_frames if video is None else len(video)
        job.control_shape = ((made - 1) // ft + 1 + len(job.vace.references), vh, vw)
        self._check_control_fits(job, base)

    def _scale(self, value: Any) -> list[float]:
        scale = [float(value)] * self.vace_layers if isinstance(value, (int, float)) else [float(v) for v in value]
        if len(scale) != self.vace_layers:
            raise InvalidRequestError(
                "conditioning_scale", f"{len(scale)} values; this model has {self.vace_layers} VACE layers"
            )
        if not all(math.isfinite(v) for v in scale):
            raise InvalidRequestError("conditioning_scale", "values must be finite")
        return scale

    def _check_control_fits(self, job: WanVaceJob, base: int) -> None:
        """The DiT pads the control tokens up to the video's; more of them than that it cannot take (a source
        video longer than ``num_frames``): refused here rather than failing in the forward."""
        t, vh, vw = job.control_shape
        control = t * (vh // base) * (vw // base)
        latent = self.latent_frames(job) * (job.height // base) * (job.width // base)
        if control > latent:
            raise InvalidRequestError(
                VIDEO,
                f"{len(job.vace.video)} frames of {vw}x{vh} condition more than the {job.num_frames} frames of "
                f"{job.width}x{job.height} asked (num_frames, height, width)",
            )

    def batch_key(self, job: WanVaceJob) -> Hashable:
        return ("wan_vace", *super().batch_key(job)[1:], job.control_shape)

    def latent_frames(self, job: WanVaceJob) -> int:
        return super().latent_frames(job) + len(job.vace.references)  # one latent frame per reference picture

    def init_latents(self, job: WanVaceJob) -> None:
        control = control_latents(self.pipe, job, self.device, self.model_dtype)
        scale = torch.tensor(job.scale)[None].to(self.device, self.model_dtype)  # [1, VACE layers]
        for cond in (job.cond, job.uncond):
            if cond is not None:
                cond["control"], cond["control_scale"] = control, scale
        super().init_latents(job)  # the noise, drawn after (the control latents draw none)

    def _forward(self, model: Any, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(
            hidden_states=x.to(self.model_dtype),
            timestep=t,
            encoder_hidden_states=cond["encoder_hidden_states"],
            control_hidden_states=cond["control"],
            # [layers, rows, 1, 1]: the DiT unbinds it per layer and multiplies each row's hint by its scale
            control_hidden_states_scale=cond["control_scale"].T[:, :, None, None],
            return_dict=False,
        )[0]

    def block_layouts(self) -> list[BlockLayout]:
        # the VACE hints are added between the DiT's blocks: a cache that skips the chain of blocks would drop
        # them, so this family declares none (step caching is refused; torch.compile compiles the DiT whole)
        return []

    def video_latents(self, job: WanVaceJob) -> torch.Tensor:
        return job.latents[:, :, len(job.vace.references) :]  # the reference pictures' frames are not decoded
