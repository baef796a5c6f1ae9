"""Stable Diffusion 3 / 3.5 (MMDiT, flow matching, CLIP-L + CLIP-G + T5) for the diffusion engine.

Mirrors StableDiffusion3Pipeline / StableDiffusion3Img2ImgPipeline ``__call__``
step by step so that one request alone reproduces them exactly.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.blocks import JOINT_BLOCK, BlockLayout, adaln_zero_probe
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

MAX_SEQUENCE_LENGTH = 256  # diffusers' default T5 length for SD3
T5_LIMIT = 512


@dataclass
class SD3Job(DiffusionJob):
    """A request's SD3 state, set in validate."""

    max_sequence_length: int = 0
    t_start: int = 0  # img2img: the schedule steps skipped (from ``strength``), 0 otherwise


class SD3Adapter(DiffusersAdapter):
    job_class = SD3Job
    pipeline_class_name = "StableDiffusion3Pipeline"

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * self.pipe.transformer.config.patch_size

    # ------------------------------------------------------------- request checks

    def max_side(self) -> int | None:
        """The largest height/width the positional embedding covers: diffusers' ``PatchEmbed`` crops a
        ``pos_embed_max_size``-patch grid and fails on larger latents (after the work of encoding them)."""
        patches = self.pipe.transformer.config.get("pos_embed_max_size")
        return None if patches is None else patches * self.size_multiple()

    def validate(self, job: SD3Job) -> None:
        p = job.params
        self.validate_size(
            job, f"VAE factor {self.pipe.vae_scale_factor} x patch size {self.pipe.transformer.config.patch_size}"
        )
        limit = self.max_side()
        for name in ("height", "width"):
            if limit is not None and getattr(job, name) > limit:
                raise InvalidRequestError(
                    name,
                    f"{getattr(job, name)} exceeds this model's maximum of {limit} "
                    f"(pos_embed_max_size {self.pipe.transformer.config.pos_embed_max_size} "
                    f"patches x {self.size_multiple()} pixels)",
                )
        msl = p.max_sequence_length or MAX_SEQUENCE_LENGTH
        if msl > T5_LIMIT:
            raise InvalidRequestError("max_sequence_length", f"{msl} exceeds the T5 limit of {T5_LIMIT}")
        job.max_sequence_length = msl
        self.validate_rows(job)
        job.t_start = self._t_start(job)
        self.check_steps(job, job.t_start)

    def _t_start(self, job: SD3Job) -> int:
        if not job.images:
            return 0
        steps = job.params.num_inference_steps
        init = min(steps * job.strength, steps)  # StableDiffusion3Img2ImgPipeline.get_timesteps
        return int(max(steps - init, 0))

    def batch_key(self, job: SD3Job) -> Hashable:
        # MMDiT has no text mask: the T5 length must match inside a batch, like the latent size.
        return ("sd3", job.height, job.width, job.max_sequence_length)

    # ------------------------------------------------------------- preparation

    def embed(self, prompts: list[str], jobs: list[SD3Job]) -> dict[str, torch.Tensor]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            do_classifier_free_guidance=False,
            device=self.device,
            num_images_per_prompt=1,
            max_sequence_length=jobs[0].max_sequence_length,
        )
        return {"encoder_hidden_states": embeds, "pooled_projections": pooled}

    def timesteps(self, job: SD3Job) -> None:
        kwargs: dict[str, Any] = {}
        mu = job.params.extra_args.get("mu")
        if self.pipe.scheduler.config.get("use_dynamic_shifting", None) and mu is None:
            patch = self.pipe.transformer.config.patch_size
            f = self.pipe.vae_scale_factor
            mu = self.dynamic_shift_mu((job.height // f // patch) * (job.width // f // patch))
        if mu is not None:
            kwargs["mu"] = mu
        job.sampler_state = self.sampler.make_state(
            job.params.num_inference_steps, job.t_start, device=self.device, **kwargs
        )

    def init_latents(self, job: SD3Job) -> None:
        f = self.pipe.vae_scale_factor
        dtype = job.cond["encoder_hidden_states"].dtype
        if not job.images:
            shape = (job.rows, self.pipe.transformer.config.in_channels, job.height // f, job.width // f)
            job.latents = self.noise(job, shape, dtype)
            return
        init = self.image_latents(job, dtype)
        noise = self.noise(job, tuple(init.shape), dtype)
        t0 = job.sampler_state.timesteps[:1].repeat(job.rows)
        job.latents = job.sampler_state.scheduler.scale_noise(init, t0, noise).to(device=self.device, dtype=dtype)

    # ------------------------------------------------------------- the batched part

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.pipe.transformer(
            hidden_states=x,
            timestep=t,
            encoder_hidden_states=cond["encoder_hidden_states"],
            pooled_projections=cond["pooled_projections"],
            return_dict=False,
        )[0]

    def block_layouts(self) -> list[BlockLayout]:
        tr = self.pipe.transformer
        return [BlockLayout.uniform(tr, tr.transformer_blocks, JOINT_BLOCK, probe=adaln_zero_probe)]
