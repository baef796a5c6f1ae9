"""Stable Diffusion 1.5 and SDXL (UNet, Euler/DDIM/PNDM/...) for the diffusion engine.

Mirrors StableDiffusion(XL)Pipeline / StableDiffusion(XL)Img2ImgPipeline
``__call__`` so that one request alone reproduces them exactly. SDXL adds the
pooled CLIP-G embedding and the micro-conditioning time ids per row.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

XL_CLASSES = {"StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline"}
XL_KNOBS = ("original_size", "crops_coords_top_left", "target_size")


@dataclass
class SDJob(DiffusionJob):
    """A request's Stable Diffusion state, set in validate."""

    t_start: int = 0  # img2img: the schedule steps skipped (from ``strength``), 0 otherwise


class SDAdapter(DiffusersAdapter):
    job_class = SDJob
    pipeline_class_name = "StableDiffusionPipeline"

    # ------------------------------------------------------------- request checks

    def validate(self, job: SDJob) -> None:
        p = job.params
        if job.images and (p.height is None or p.width is None):
            # img2img keeps the input's size (rounded to the VAE factor), as diffusers' preprocess does
            h, w = self.pipe.image_processor.get_default_height_width(job.images[0])
            job.params = p = p.model_copy(update={"height": p.height or h, "width": p.width or w})
        self.validate_size(job, f"VAE factor {self.pipe.vae_scale_factor}")
        self.validate_rows(job)
        self.validate_extra(job)
        t_start = 0
        if job.images:
            steps = p.num_inference_steps
            t_start = max(
                steps - min(int(steps * job.strength), steps), 0
            )  # StableDiffusionImg2ImgPipeline.get_timesteps
        job.t_start = t_start
        self.check_steps(job, t_start)

    def validate_extra(self, job: SDJob) -> None:
        for k in XL_KNOBS:
            if k in job.params.extra_args:
                raise InvalidRequestError(f"extra_args.{k}", "only SDXL models take it")

    def batch_key(self, job: SDJob) -> Hashable:
        # CLIP text is always padded to 77 tokens: only the latent size separates batches.
        return (type(self).__name__, job.height, job.width)

    # ------------------------------------------------------------- preparation

    def embed(self, prompts: list[str], jobs: list[SDJob]) -> dict[str, torch.Tensor]:
        embeds, _ = self.pipe.encode_prompt(prompts, self.device, 1, False)
        return {"encoder_hidden_states": embeds}

    def timesteps(self, job: SDJob) -> None:
        job.sampler_state = self.sampler.make_state(job.params.num_inference_steps, job.t_start, device=self.device)

    def init_latents(self, job: SDJob) -> None:
        f = self.pipe.vae_scale_factor
        dtype = job.cond["encoder_hidden_states"].dtype
        sched = job.sampler_state.scheduler
        if not job.images:
            shape = (job.rows, self.pipe.unet.config.in_channels, job.height // f, job.width // f)
            job.latents = self.noise(job, shape, dtype) * sched.init_noise_sigma
            return
        init = self.image_latents(job, dtype)
        noise = self.noise(job, tuple(init.shape), dtype)
        job.latents = sched.add_noise(init, noise, job.sampler_state.timesteps[:1].repeat(job.rows))

    # ------------------------------------------------------------- the batched part

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        added = {"text_embeds": cond["text_embeds"], "time_ids": cond["time_ids"]} if "time_ids" in cond else None
        return self.pipe.unet(
            x,
            t,
            encoder_hidden_states=cond["encoder_hidden_states"],
            timestep_cond=None,
            cross_attention_kwargs=None,
            added_cond_kwargs=added,
            return_dict=False,
        )[0]


class SDXLAdapter(SDAdapter):
    pipeline_class_name = "StableDiffusionXLPipeline"

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        unet, te2 = pipe.unet, pipe.text_encoder_2
        if te2 is not None:  # the six micro-conditioning ids + the pooled text embedding feed add_embedding
            passed = 6 * unet.config.addition_time_embed_dim + te2.config.projection_dim
            if passed != unet.add_embedding.linear_1.in_features:
                raise ValueError(
                    f"SDXL folder: the UNet's added embedding takes {unet.add_embedding.linear_1.in_features} "
                    f"features, but time ids + text_encoder_2 give {passed}"
                )

    def validate_extra(self, job: SDJob) -> None:
        for k in XL_KNOBS:
            v = job.params.extra_args.get(k)
            if v is not None and (len(v) != 2 or not all(isinstance(x, int) for x in v)):
                raise InvalidRequestError(f"extra_args.{k}", f"expected two integers, got {v!r}")

    def embed(self, prompts: list[str], jobs: list[SDJob]) -> dict[str, torch.Tensor]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompts, device=self.device, num_images_per_prompt=1, do_classifier_free_guidance=False
        )
        return {"encoder_hidden_states": embeds, "text_embeds": pooled}

    def embed_negatives(self, jobs: list[SDJob]) -> dict[str, torch.Tensor]:
        if not self.pipe.config.force_zeros_for_empty_prompt:
            return super().embed_negatives(jobs)
        # diffusers zeroes the uncond embeddings when no negative prompt is given
        given = [i for i, j in enumerate(jobs) if j.negative_prompt is not None]
        enc = self.embed([jobs[i].negative_prompt for i in given], jobs) if given else None
        ref = jobs[0].cond
        out = {k: torch.zeros((len(jobs), *ref[k].shape[1:]), dtype=ref[k].dtype, device=ref[k].device) for k in ref}
        for n, i in enumerate(given):
            for k in out:
                out[k][i] = enc[k][n]
        return out

    def add_conditioning(self, jobs: list[SDJob]) -> None:
        for j in jobs:
            pooled = j.cond["text_embeds"]
            size = (j.height, j.width)
            extra = j.params.extra_args
            # SDXL's micro-conditioning: original size, crop corner, target size, six ints per row
            time_ids = [
                *(extra.get("original_size") or size),
                *(extra.get("crops_coords_top_left") or (0, 0)),
                *(extra.get("target_size") or size),
            ]
            ids = self.repeat_rows(torch.tensor([time_ids], dtype=pooled.dtype, device=self.device), j.rows)
            j.cond["time_ids"] = ids
            if j.uncond is not None:
                j.uncond["time_ids"] = ids

    def normalize_latents(self, z: torch.Tensor) -> torch.Tensor:
        cfg = self.pipe.vae.config
        if cfg.get("latents_mean") is None or cfg.get("latents_std") is None:
            return super().normalize_latents(z)
        mean, std = self.channel_stats(z)
        return (z - mean) * cfg.scaling_factor / std

    def denormalize_latents(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.pipe.vae.config
        if cfg.get("latents_mean") is None or cfg.get("latents_std") is None:
            return super().denormalize_latents(x)
        mean, std = self.channel_stats(x)
        return x * std / cfg.scaling_factor + mean


SDAdapter.variants = {name: SDXLAdapter for name in XL_CLASSES}  # one entry point for SD 1.5 and SDXL folders
