"""Stable Diffusion 3 / 3.5 (MMDiT, flow matching, CLIP-L + CLIP-G + T5) for the diffusion engine.

Mirrors StableDiffusion3Pipeline / StableDiffusion3Img2ImgPipeline ``__call__``
step by step so that one request alone reproduces them exactly.
"""

from __future__ import annotations

from typing import Any, Hashable

import torch

from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

MAX_SEQUENCE_LENGTH = 256  # diffusers' default T5 length for SD3
T5_LIMIT = 512


class SD3Adapter(DiffusersAdapter):
    pipeline_class_name = "StableDiffusion3Pipeline"

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * self.pipe.transformer.config.patch_size

    # ------------------------------------------------------------- request checks

    def validate(self, job: DiffusionJob) -> None:
        p = job.params
        self.validate_size(job, f"VAE factor {self.pipe.vae_scale_factor} x patch size "
                                f"{self.pipe.transformer.config.patch_size}")
        msl = p.max_sequence_length or MAX_SEQUENCE_LENGTH
        if msl > T5_LIMIT:
            raise ValueError(f"max_sequence_length: {msl} exceeds the T5 limit of {T5_LIMIT}")
        job.extra["max_sequence_length"] = msl
        self.validate_rows(job)
        job.extra["t_start"] = self._t_start(job)
        self.check_steps(job, job.extra["t_start"])

    def _t_start(self, job: DiffusionJob) -> int:
        if not job.images:
            return 0
        steps = job.params.num_inference_steps
        init = min(steps * job.strength, steps)  # StableDiffusion3Img2ImgPipeline.get_timesteps
        return int(max(steps - init, 0))

    def batch_key(self, job: DiffusionJob) -> Hashable:
        # MMDiT has no text mask: the T5 length must match inside a batch, like the latent size.
        return ("sd3", job.height, job.width, job.extra["max_sequence_length"])

    # ------------------------------------------------------------- preparation

    def _embed(self, prompts: list[str], msl: int) -> tuple[torch.Tensor, torch.Tensor]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, do_classifier_free_guidance=False, device=self.device,
            num_images_per_prompt=1, max_sequence_length=msl)
        return embeds, pooled

    def encode(self, jobs: list[DiffusionJob]) -> None:
        msl = jobs[0].extra["max_sequence_length"]
        embeds, pooled = self._embed([j.prompt for j in jobs], msl)
        for i, j in enumerate(jobs):
            j.cond = {"encoder_hidden_states": self.repeat_rows(embeds[i:i + 1], j.rows),
                      "pooled_projections": self.repeat_rows(pooled[i:i + 1], j.rows)}
        cfg = [j for j in jobs if j.do_cfg]
        if cfg:
            # diffusers encodes negatives in their own call, with "" for a missing negative prompt
            embeds, pooled = self._embed([j.negative_prompt or "" for j in cfg], msl)
            for i, j in enumerate(cfg):
                j.uncond = {"encoder_hidden_states": self.repeat_rows(embeds[i:i + 1], j.rows),
                            "pooled_projections": self.repeat_rows(pooled[i:i + 1], j.rows)}

    def timesteps(self, job: DiffusionJob) -> None:
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

        cfg = self.pipe.scheduler.config
        kwargs: dict[str, Any] = {}
        mu = job.params.extra_args.get("mu")
        if cfg.get("use_dynamic_shifting", None) and mu is None:
            patch = self.pipe.transformer.config.patch_size
            f = self.pipe.vae_scale_factor
            seq_len = (job.height // f // patch) * (job.width // f // patch)
            mu = calculate_shift(seq_len, cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096),
                                 cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.16))
        if mu is not None:
            kwargs["mu"] = mu
        job.sampler_state = self.sampler.make_state(job.params.num_inference_steps, job.extra["t_start"],
                                                    device=self.device, **kwargs)

    def init_latents(self, job: DiffusionJob) -> None:
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3_img2img import retrieve_latents
        from diffusers.utils.torch_utils import randn_tensor

        f = self.pipe.vae_scale_factor
        channels = self.pipe.transformer.config.in_channels
        dtype = job.cond["encoder_hidden_states"].dtype
        if not job.images:
            shape = (job.rows, channels, job.height // f, job.width // f)
            job.latents = randn_tensor(shape, generator=job.generator, device=self.device, dtype=dtype)
            return
        vae = self.pipe.vae
        image = self.pipe.image_processor.preprocess(job.images, height=job.height, width=job.width)
        image = image.to(device=self.device, dtype=dtype)
        init = retrieve_latents(vae.encode(image), generator=job.generator)
        init = (init - vae.config.shift_factor) * vae.config.scaling_factor
        if job.rows > init.shape[0]:
            init = torch.cat([init] * (job.rows // init.shape[0]), dim=0)
        noise = randn_tensor(init.shape, generator=job.generator, device=self.device, dtype=dtype)
        t0 = job.sampler_state.timesteps[:1].repeat(job.rows)
        job.latents = job.sampler_state.scheduler.scale_noise(init, t0, noise).to(device=self.device, dtype=dtype)

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=cond["encoder_hidden_states"],
                                     pooled_projections=cond["pooled_projections"], return_dict=False)[0]

    def decode(self, jobs: list[DiffusionJob]) -> list[list[Any]]:
        vae = self.pipe.vae
        latents = torch.cat([j.latents for j in jobs])
        latents = (latents / vae.config.scaling_factor) + vae.config.shift_factor
        return self.to_uint8(vae.decode(latents, return_dict=False)[0], jobs)
