"""The Wan 2.1 / 2.2 text-to-video loop (3-D DiT, UMT5 text encoder, causal video VAE) for the diffusion engine,
shared by the families built on it (``wan``: text- and image-to-video; ``wan_vace``: VACE-conditioned video).

Mirrors ``WanPipeline.__call__`` step by step so that one request alone
reproduces it exactly: fp32 latents [B, C, T', H', W'] from the request's
generator, the folder's scheduler (UniPC on flow sigmas for the released
checkpoints) stepped per request, cond and uncond as separate forwards (as
diffusers runs them: a B=2 forward differs from two B=1 forwards by float
batch variance), and Wan2.2's two experts switched per row at the boundary
timestep with ``guidance_scale_2`` in the low-noise phase.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.flow_schedule import start_schedule
from omnistage.models.shared.input_checks import refuse_images
from omnistage.stages.diffusion.adapter import DiffusionJob, frames_of_form
from omnistage.stages.diffusion.blocks import BlockIO, BlockLayout
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter
from omnistage.stages.diffusion.step_cache import row_subset

# WanPipeline.__call__'s own defaults (tests check they still agree)
DEFAULT_HEIGHT = 480
DEFAULT_WIDTH = 832
DEFAULT_NUM_FRAMES = 81
MAX_SEQUENCE_LENGTH = 512
DEFAULT_FPS = 16  # what the Wan releases export their videos at
# WanTransformerBlock(hidden_states, encoder_hidden_states, temb, rotary_emb) -> hidden_states
WAN_BLOCK = BlockIO(returns="hidden_states", per_row=("encoder_hidden_states", "temb"))


def umt5_embeds(adapter: DiffusersAdapter, prompts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
    """The prompts' UMT5 embeddings as a Wan-family pipeline's ``encode_prompt`` makes them (each prompt padded to
    ``max_sequence_length``), in the denoiser's dtype: Wan's, VACE's and Helios' conditioning."""
    embeds, _ = adapter.pipe.encode_prompt(
        prompt=prompts,
        do_classifier_free_guidance=False,
        num_videos_per_prompt=1,
        max_sequence_length=max_sequence_length,
        device=adapter.device,
    )
    return {"encoder_hidden_states": embeds.to(adapter.model_dtype)}


@dataclass
class WanJob(DiffusionJob):
    """A request's Wan state, set in validate."""

    num_frames: int = 0
    max_sequence_length: int = 0


class WanAdapter(DiffusersAdapter):
    job_class = WanJob
    pipeline_class_name = "WanPipeline"
    separate_cfg_passes = True

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        self.model_dtype = model.dtype
        self.in_channels = model.config.in_channels
        self.patch = tuple(model.config.patch_size)  # (t, h, w)
        ratio = pipe.config.boundary_ratio
        self.boundary = None if ratio is None else ratio * pipe.scheduler.config.num_train_timesteps

    # ------------------------------------------------------------- request checks

    def validate(self, job: WanJob) -> None:
        refuse_images(job, "this is a text-to-video model; it takes no input image")
        self.validate_video(job)

    def validate_video(
        self, job: WanJob, size: tuple[int, int] = (DEFAULT_HEIGHT, DEFAULT_WIDTH), frames: int = DEFAULT_NUM_FRAMES
    ) -> None:
        """Height, width and frame count (``size`` and ``frames`` where the request sets none), checked."""
        p = job.params
        f = self.pipe.vae_scale_factor_spatial
        for name, multiple, default in (
            ("height", f * self.patch[1], size[0]),
            ("width", f * self.patch[2], size[1]),
        ):
            value = getattr(p, name) or default
            if value % multiple:
                raise InvalidRequestError(
                    name, f"{value} is not divisible by {multiple} (VAE factor {f} x patch size {multiple // f})"
                )
            setattr(job, name, int(value))
        ft = self.pipe.vae_scale_factor_temporal
        frames = frames_of_form(job, p.num_frames or frames, ft)
        if frames % ft != 1:  # WanPipeline's own rounding of a count its VAE does not make
            frames = frames // ft * ft + 1
        job.num_frames = frames
        self.check_rope_range(job)
        if p.num_outputs_per_prompt != 1:
            raise InvalidRequestError(
                "num_outputs_per_prompt",
                f"{p.num_outputs_per_prompt}; a video request makes one video "
                "(send several requests: they share the forwards)",
            )
        if p.guidance_scale_2 is not None and self.boundary is None:
            raise InvalidRequestError(
                "guidance_scale_2", "this model has no low-noise expert (boundary_ratio is not set)"
            )
        job.max_sequence_length = p.max_sequence_length or MAX_SEQUENCE_LENGTH
        job.rows = 1

    def check_rope_range(self, job: WanJob) -> None:
        """The DiT's rotary table covers ``rope_max_seq_len`` patches per axis; beyond it the forward fails
        (after the text encoding and VAE work), so a request that needs more is refused here."""
        model = self.pipe.transformer if self.pipe.transformer is not None else self.pipe.transformer_2
        most = model.config.rope_max_seq_len
        f, ft = self.pipe.vae_scale_factor_spatial, self.pipe.vae_scale_factor_temporal
        pt, ph, pw = self.patch
        for name, value, unit in (
            ("num_frames", job.num_frames, None),
            ("height", job.height, f * ph),
            ("width", job.width, f * pw),
        ):
            patches = self.latent_frames(job) // pt if unit is None else value // unit
            if patches > most:
                top = (most * pt - 1) * ft + 1 if unit is None else most * unit
                raise InvalidRequestError(
                    name, f"{value} exceeds this model's maximum of {top} (rope_max_seq_len {most} patches per axis)"
                )

    def batch_key(self, job: WanJob) -> Hashable:
        # dense latents, and no text mask in the DiT: the UMT5 length must match inside a batch too
        return ("wan", job.height, job.width, self.latent_frames(job), job.max_sequence_length)

    def latent_frames(self, job: WanJob) -> int:
        return (job.num_frames - 1) // self.pipe.vae_scale_factor_temporal + 1

    # ------------------------------------------------------------- preparation

    def embed(self, prompts: list[str], jobs: list[WanJob]) -> dict[str, torch.Tensor]:
        return umt5_embeds(self, prompts, jobs[0].max_sequence_length)

    def timesteps(self, job: WanJob) -> None:
        state = start_schedule(self, job, job.params.num_inference_steps)
        if self.boundary is not None and job.do_cfg:
            g = job.params.guidance_scale
            g2 = job.params.guidance_scale_2 if job.params.guidance_scale_2 is not None else g
            job.step_guidance = [g if t >= self.boundary else g2 for t in state.timesteps.tolist()]

    def init_latents(self, job: WanJob) -> None:
        f = self.pipe.vae_scale_factor_spatial
        shape = (job.rows, self.in_channels, self.latent_frames(job), job.height // f, job.width // f)
        # the pipeline keeps latents in fp32 whatever the model dtype
        job.latents = self.noise(job, shape, torch.float32)

    # ------------------------------------------------------------- the batched parts

    def model_input(self, x: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return x  # image-to-video appends its first-frame condition channels

    def _forward(self, model: Any, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.pipe.config.expand_timesteps:
            # Wan2.2 TI2V: one timestep per latent token (all equal for text-to-video)
            seq = x.shape[2] * (x.shape[3] // self.patch[1]) * (x.shape[4] // self.patch[2])
            t = t.to(torch.float32)[:, None].expand(-1, seq)
        return model(
            hidden_states=self.model_input(x, cond).to(self.model_dtype),
            timestep=t,
            encoder_hidden_states=cond["encoder_hidden_states"],
            encoder_hidden_states_image=cond.get("encoder_hidden_states_image"),
            return_dict=False,
        )[0]

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.boundary is None:
            return self._forward(self.pipe.transformer, x, t, cond)
        # Wan2.2 A14B: rows at high noise go to `transformer`, the rest to `transformer_2`
        high = t >= self.boundary
        if bool(high.all()):
            return self._forward(self.pipe.transformer, x, t, cond)
        if not bool(high.any()):
            return self._forward(self.pipe.transformer_2, x, t, cond)
        out = None
        for model, idx in (
            (self.pipe.transformer, high.nonzero().squeeze(1)),
            (self.pipe.transformer_2, (~high).nonzero().squeeze(1)),
        ):
            with row_subset(idx):  # the step cache learns whose rows each expert gets
                part = self._forward(model, x[idx], t[idx], {k: v[idx] for k, v in cond.items()})
            out = part.new_empty((x.shape[0], *part.shape[1:])) if out is None else out
            out.index_copy_(0, idx, part)
        return out

    def block_layouts(self) -> list[BlockLayout]:
        # TeaCache4Wan2.1 compares the timestep projection (the blocks' ``temb``) between steps
        return [
            BlockLayout.uniform(m, m.blocks, WAN_BLOCK, probe=lambda block, args: args["temb"])
            for m in (self.pipe.transformer, self.pipe.transformer_2)
            if m is not None
        ]

    def video_latents(self, job: WanJob) -> torch.Tensor:
        """The latents the VAE decodes into the job's video (all of them here)."""
        return job.latents

    def decode(self, jobs: list[WanJob]) -> list[list[np.ndarray]]:
        vae = self.pipe.vae
        latents = torch.cat([self.video_latents(j) for j in jobs]).to(self.device, dtype=vae.dtype)
        mean, std = self.channel_stats(latents)
        video = vae.decode(latents / (1.0 / std) + mean, return_dict=False)[0]  # diffusers divides by 1/std
        frames = self.pipe.video_processor.postprocess_video(video, output_type="np")  # [B, T, H, W, 3] in [0, 1]
        frames = (frames * 255).round().astype(np.uint8)  # the rounding diffusers uses for PIL output
        return [[np.ascontiguousarray(frames[i])] for i in range(len(jobs))]

    def pack_output(self, job: WanJob, decoded: list[np.ndarray]) -> dict[str, Any]:
        return {"video": decoded[0], "fps": job.params.fps or DEFAULT_FPS}
