"""Stable Diffusion 1.5 and SDXL (UNet, Euler/DDIM/PNDM/...) for the diffusion engine.

Mirrors StableDiffusion(XL)Pipeline / StableDiffusion(XL)Img2ImgPipeline
``__call__`` so that one request alone reproduces them exactly. SDXL adds the
pooled CLIP-G embedding and the micro-conditioning time ids per row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Hashable

import torch

from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

XL_CLASSES = {"StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline"}
XL_KNOBS = ("original_size", "crops_coords_top_left", "target_size")


class SDAdapter(DiffusersAdapter):
    pipeline_class_name = "StableDiffusionPipeline"

    @classmethod
    def load(cls, folder: str, dtype: torch.dtype, device: torch.device) -> "SDAdapter":
        """One family entry point for both SD 1.5 and SDXL folders."""
        index = json.loads((Path(folder) / "model_index.json").read_text())
        if cls is SDAdapter and index.get("_class_name") in XL_CLASSES:
            return SDXLAdapter.load(folder, dtype, device)
        return super().load(folder, dtype, device)

    # ------------------------------------------------------------- request checks

    def validate(self, job: DiffusionJob) -> None:
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
            t_start = max(steps - min(int(steps * job.strength), steps), 0)  # StableDiffusionImg2ImgPipeline.get_timesteps
        job.extra["t_start"] = t_start
        self.check_steps(job, t_start)

    def validate_extra(self, job: DiffusionJob) -> None:
        for k in XL_KNOBS:
            if k in job.params.extra_args:
                raise ValueError(f"extra_args.{k}: only SDXL models take it")

    def batch_key(self, job: DiffusionJob) -> Hashable:
        # CLIP text is always padded to 77 tokens: only the latent size separates batches.
        return (type(self).__name__, job.height, job.width)

    # ------------------------------------------------------------- preparation

    def _embed(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        embeds, _ = self.pipe.encode_prompt(prompts, self.device, 1, False)
        return {"encoder_hidden_states": embeds}

    def _negatives(self, jobs: list[DiffusionJob]) -> dict[str, torch.Tensor]:
        return self._embed([j.negative_prompt or "" for j in jobs])  # diffusers uses "" when none is given

    def encode(self, jobs: list[DiffusionJob]) -> None:
        cond = self._embed([j.prompt for j in jobs])
        for i, j in enumerate(jobs):
            j.cond = {k: self.repeat_rows(v[i:i + 1], j.rows) for k, v in cond.items()}
        cfg = [j for j in jobs if j.do_cfg]
        if cfg:
            uncond = self._negatives(cfg)
            for i, j in enumerate(cfg):
                j.uncond = {k: self.repeat_rows(v[i:i + 1], j.rows) for k, v in uncond.items()}
        self.add_conditioning(jobs)

    def add_conditioning(self, jobs: list[DiffusionJob]) -> None:
        """Per-row extras beyond the text embeddings (SDXL time ids)."""

    def timesteps(self, job: DiffusionJob) -> None:
        job.sampler_state = self.sampler.make_state(job.params.num_inference_steps, job.extra["t_start"],
                                                    device=self.device)

    def init_latents(self, job: DiffusionJob) -> None:
        from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_img2img import retrieve_latents
        from diffusers.utils.torch_utils import randn_tensor

        f = self.pipe.vae_scale_factor
        dtype = job.cond["encoder_hidden_states"].dtype
        sched = job.sampler_state.scheduler
        if not job.images:
            shape = (job.rows, self.pipe.unet.config.in_channels, job.height // f, job.width // f)
            noise = randn_tensor(shape, generator=job.generator, device=self.device, dtype=dtype)
            job.latents = noise * sched.init_noise_sigma
            return
        vae = self.pipe.vae
        image = self.pipe.image_processor.preprocess(job.images, height=job.height, width=job.width)
        image = image.to(device=self.device, dtype=dtype)
        init = retrieve_latents(vae.encode(image), generator=job.generator)
        init = vae.config.scaling_factor * init
        if job.rows > init.shape[0]:
            init = torch.cat([init] * (job.rows // init.shape[0]), dim=0)
        noise = randn_tensor(init.shape, generator=job.generator, device=self.device, dtype=dtype)
        t0 = job.sampler_state.timesteps[:1].repeat(job.rows)
        job.latents = sched.add_noise(init, noise, t0)

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        added = {"text_embeds": cond["text_embeds"], "time_ids": cond["time_ids"]} if "time_ids" in cond else None
        return self.pipe.unet(x, t, encoder_hidden_states=cond["encoder_hidden_states"], timestep_cond=None,
                              cross_attention_kwargs=None, added_cond_kwargs=added, return_dict=False)[0]

    def unscale(self, latents: torch.Tensor) -> torch.Tensor:
        return latents / self.pipe.vae.config.scaling_factor

    def decode(self, jobs: list[DiffusionJob]) -> list[list[Any]]:
        latents = self.unscale(torch.cat([j.latents for j in jobs]))
        return self.to_uint8(self.pipe.vae.decode(latents, return_dict=False)[0], jobs)


class SDXLAdapter(SDAdapter):
    pipeline_class_name = "StableDiffusionXLPipeline"

    def validate_extra(self, job: DiffusionJob) -> None:
        for k in XL_KNOBS:
            v = job.params.extra_args.get(k)
            if v is not None and (len(v) != 2 or not all(isinstance(x, int) for x in v)):
                raise ValueError(f"extra_args.{k}: expected two integers, got {v!r}")

    def _embed(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(prompts, device=self.device, num_images_per_prompt=1,
                                                       do_classifier_free_guidance=False)
        return {"encoder_hidden_states": embeds, "text_embeds": pooled}

    def _negatives(self, jobs: list[DiffusionJob]) -> dict[str, torch.Tensor]:
        if not self.pipe.config.force_zeros_for_empty_prompt:
            return super()._negatives(jobs)
        # diffusers zeroes the uncond embeddings when no negative prompt is given
        given = [i for i, j in enumerate(jobs) if j.negative_prompt is not None]
        enc = self._embed([jobs[i].negative_prompt for i in given]) if given else None
        ref = jobs[0].cond
        out = {k: torch.zeros((len(jobs), *ref[k].shape[1:]), dtype=ref[k].dtype, device=ref[k].device) for k in ref}
        for n, i in enumerate(given):
            for k in out:
                out[k][i] = enc[k][n]
        return out

    def add_conditioning(self, jobs: list[DiffusionJob]) -> None:
        te2 = self.pipe.text_encoder_2
        for j in jobs:
            pooled = j.cond["text_embeds"]
            proj_dim = int(pooled.shape[-1]) if te2 is None else te2.config.projection_dim
            size = (j.height, j.width)
            extra = j.params.extra_args
            ids = self.pipe._get_add_time_ids(tuple(extra.get("original_size") or size),
                                              tuple(extra.get("crops_coords_top_left") or (0, 0)),
                                              tuple(extra.get("target_size") or size), dtype=pooled.dtype,
                                              text_encoder_projection_dim=proj_dim)
            ids = self.repeat_rows(ids.to(self.device), j.rows)
            j.cond["time_ids"] = ids
            if j.uncond is not None:
                j.uncond["time_ids"] = ids

    def unscale(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.pipe.vae.config
        mean, std = getattr(cfg, "latents_mean", None), getattr(cfg, "latents_std", None)
        if mean is not None and std is not None:
            mean = torch.tensor(mean).view(1, -1, 1, 1).to(latents.device, latents.dtype)
            std = torch.tensor(std).view(1, -1, 1, 1).to(latents.device, latents.dtype)
            return latents * std / cfg.scaling_factor + mean
        return latents / cfg.scaling_factor
