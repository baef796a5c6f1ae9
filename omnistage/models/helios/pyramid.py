"""Helios' pyramid variant (HeliosPyramidPipeline): inside every chunk the schedule runs in resolution stages,
from 1/2^(S-1) of the latent size up to the full size, each stage its own schedule; between stages the latents
are upsampled (nearest) and renoised with block noise.

Each stage is a phase of the request: at a stage's last step ``after_step`` upsamples, renoises and restarts the
schedule, and the request's batch key changes to the next stage's (its latent size differs), so requests share a
forward where they are at the same stage. ``num_inference_steps`` is the steps of each stage (the pipeline's
``pyramid_num_inference_steps_list`` is that number once per stage).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from omnistage.models.helios.adapter import HeliosAdapter, HeliosJob, HeliosRun

DEFAULT_STAGE_STEPS = 10  # HeliosPyramidPipeline.__call__'s pyramid_num_inference_steps_list is [10, 10, 10]


@dataclass
class HeliosPyramidJob(HeliosJob):
    stage: int = 0  # the pyramid stage the request's chunk is in (lowest resolution first)


class HeliosPyramidAdapter(HeliosAdapter):
    pipeline_class_name = "HeliosPyramidPipeline"
    job_class = HeliosPyramidJob
    pyramid = True

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        for flag, what in (
            ("is_distilled", "a distilled pyramid (DMD sampling)"),
            (
                "is_cfg_zero_star",
                "CFG-zero* guidance (diffusers' own path for it fails: it views the DiT's non-contiguous output)",
            ),
        ):
            if pipe.config.get(flag, False):
                raise ValueError(f"HeliosPyramidPipeline with {flag}=True: {what} is not supported yet")
        self.stages = pipe.scheduler.config.stages

    @property
    def size_rule(self) -> str:
        return f"{super().size_rule} x {2 ** (self.stages - 1)}, for the pyramid's lowest stage"

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor_spatial * self.patch[1] * 2 ** (self.stages - 1)

    def validate(self, job: HeliosPyramidJob) -> None:
        super().validate(job)
        job.stage = 0

    def batch_key(self, job: HeliosPyramidJob) -> Hashable:
        # the stage sets the latent size; a request's key changes as it climbs the pyramid
        return ("helios_pyramid", job.height, job.width, job.max_sequence_length, job.stage)

    def steps_per_chunk(self, job: HeliosPyramidJob) -> int:
        return self.stages * job.params.num_inference_steps

    def start_phase(self, job: HeliosPyramidJob, noise: torch.Tensor, chunk_start: bool) -> None:
        """A chunk's first stage: the full-size noise downsampled (bilinear, x2 per halving) to the lowest stage."""
        b, c, f, h, w = noise.shape
        latents = noise.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
        for _ in range(self.stages - 1):
            h, w = h // 2, w // 2
            latents = F.interpolate(latents, size=(h, w), mode="bilinear") * 2
        job.latents = latents.reshape(b, f, c, h, w).permute(0, 2, 1, 3, 4)
        job.stage = 0
        self.stage_schedule(job)
        job.key = self.batch_key(job)

    def stage_schedule(self, job: HeliosPyramidJob) -> None:
        # the shift comes from the latent size before the stage's upsampling, as the pipeline computes it
        x = job.latents
        seq = x.shape[-1] * x.shape[-2] * x.shape[-3] // math.prod(self.patch)
        state = self.sampler.make_state(
            job.params.num_inference_steps,
            device=self.device,
            stage_index=job.stage,
            mu=self.dynamic_shift_mu(seq),
            is_amplify_first_chunk=False,
        )
        self.set_phase(job, state)

    def end_phase(self, job: HeliosPyramidJob) -> None:
        if job.stage == self.stages - 1:
            self.end_chunk(job)
            return
        job.stage += 1
        self.stage_schedule(job)
        b, c, f, h, w = job.latents.shape
        latents = job.latents.permute(0, 2, 1, 3, 4).reshape(b * f, c, h, w)
        latents = F.interpolate(latents, size=(2 * h, 2 * w), mode="nearest")
        latents = latents.reshape(b, f, c, 2 * h, 2 * w).permute(0, 2, 1, 3, 4)
        # renoise to the stage's start point (the pipeline's block-artifact fix)
        sched = job.sampler_state.scheduler
        ori_sigma = 1 - sched.ori_start_sigmas[job.stage]
        gamma = sched.config.gamma
        alpha = 1 / (math.sqrt(1 + (1 / gamma)) * (1 - ori_sigma) + ori_sigma)
        beta = alpha * (1 - ori_sigma) / math.sqrt(gamma)
        noise = self.pipe.sample_block_noise(b, c, f, 2 * h, 2 * w, self.patch, self.device, job.generator)
        job.latents = alpha * latents + beta * noise.to(device=self.device, dtype=self.model_dtype)
        job.key = self.batch_key(job)

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.int64)  # the pyramid pipeline feeds integer timesteps


__all__ = ["HeliosPyramidAdapter", "HeliosRun"]
