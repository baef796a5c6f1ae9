"""Wan image-to-video: ``WanImageToVideoPipeline.__call__`` on the diffusion engine.

Same loop as text-to-video; the input image adds per-request conditioning:
its VAE latents (first frame, zeros after) with a frame mask, concatenated to
the noisy latents' channels at every forward, and, for Wan2.1 I2V, CLIP vision
tokens placed before the text tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.models.wan.adapter import MAX_SEQUENCE_LENGTH, WanAdapter
from omnistage.stages.diffusion.adapter import DiffusionJob


class WanI2VAdapter(WanAdapter):
    pipeline_class_name = "WanImageToVideoPipeline"

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        if pipe.config.expand_timesteps:
            raise ValueError("WanImageToVideoPipeline with expand_timesteps (Wan2.2 TI2V) is not supported yet")
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        self.uses_clip = model.config.image_dim is not None

    def validate(self, job: DiffusionJob) -> None:
        if not job.images:
            raise ValueError("multi_modal_data.image: image-to-video needs the first frame as an input image")
        if len(job.images) != 1:
            raise ValueError(f"multi_modal_data.image: expected one first-frame image, got {len(job.images)}")
        if job.params.strength is not None:
            raise ValueError("strength: not used by image-to-video (the image is the first frame)")
        self.validate_video(job)
        if self.uses_clip and job.extra["max_sequence_length"] != MAX_SEQUENCE_LENGTH:
            # the DiT takes everything before the last 512 context tokens as image tokens
            raise ValueError(f"max_sequence_length: this model needs {MAX_SEQUENCE_LENGTH} "
                             f"(its transformer splits image and text tokens there)")

    def encode(self, jobs: list[DiffusionJob]) -> None:
        super().encode(jobs)
        if not self.uses_clip:
            return
        embeds = self.pipe.encode_image([j.images[0] for j in jobs], self.device).to(self.model_dtype)
        for i, j in enumerate(jobs):
            for cond in (j.cond, j.uncond):
                if cond is not None:
                    cond["encoder_hidden_states_image"] = embeds[i:i + 1]

    def init_latents(self, job: DiffusionJob) -> None:
        image = self.pipe.video_processor.preprocess(job.images[0], height=job.height, width=job.width)
        latents, condition = self.pipe.prepare_latents(
            image.to(self.device, dtype=torch.float32), job.rows, self.pipe.vae.config.z_dim, job.height, job.width,
            job.extra["num_frames"], torch.float32, self.device, job.generator)
        job.latents = latents
        for cond in (job.cond, job.uncond):
            if cond is not None:
                cond["condition"] = condition

    def model_input(self, x: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([x, cond["condition"]], dim=1)
