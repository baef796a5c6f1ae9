"""Wan 2.1 / 2.2 text- and image-to-video for the diffusion engine: the text-to-video loop is
``omnistage/models/shared/wan_adapter.py``; image-to-video (``WanImageToVideoPipeline.__call__``) adds its
first-frame conditioning here.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.wan_adapter import (
    DEFAULT_FPS,
    DEFAULT_HEIGHT,
    DEFAULT_NUM_FRAMES,
    DEFAULT_WIDTH,
    MAX_SEQUENCE_LENGTH,
    WanAdapter,
    WanJob,
)
from omnistage.stages.diffusion.adapter import check_first_frame

__all__ = [
    "DEFAULT_FPS",
    "DEFAULT_HEIGHT",
    "DEFAULT_NUM_FRAMES",
    "DEFAULT_WIDTH",
    "MAX_SEQUENCE_LENGTH",
    "WanAdapter",
    "WanI2VAdapter",
    "WanJob",
]


# Image-to-video (WanImageToVideoPipeline): the same loop; the input image adds per-request conditioning —
# its VAE latents (first frame, zeros after) with a frame mask, concatenated to the noisy latents' channels at
# every forward, and, for Wan2.1 I2V, CLIP vision tokens placed before the text tokens.
class WanI2VAdapter(WanAdapter):
    pipeline_class_name = "WanImageToVideoPipeline"

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        if pipe.config.expand_timesteps:
            raise ValueError("WanImageToVideoPipeline with expand_timesteps (Wan2.2 TI2V) is not supported yet")
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        self.uses_clip = model.config.image_dim is not None

    def validate(self, job: WanJob) -> None:
        check_first_frame(job)
        if job.params.strength is not None:
            raise InvalidRequestError("strength", "not used by image-to-video (the image is the first frame)")
        self.validate_video(job)
        if self.uses_clip and job.max_sequence_length != MAX_SEQUENCE_LENGTH:
            # the DiT takes everything before the last 512 context tokens as image tokens
            raise InvalidRequestError(
                "max_sequence_length",
                f"this model needs {MAX_SEQUENCE_LENGTH} (its transformer splits image and text tokens there)",
            )

    def encode(self, jobs: list[WanJob]) -> None:
        super().encode(jobs)
        if not self.uses_clip:
            return
        embeds = self.pipe.encode_image([j.images[0] for j in jobs], self.device).to(self.model_dtype)
        for i, j in enumerate(jobs):
            for cond in (j.cond, j.uncond):
                if cond is not None:
                    cond["encoder_hidden_states_image"] = embeds[i : i + 1]

    def init_latents(self, job: WanJob) -> None:
        image = self.pipe.video_processor.preprocess(job.images[0], height=job.height, width=job.width)
        latents, condition = self.pipe.prepare_latents(
            image.to(self.device, dtype=torch.float32),
            job.rows,
            self.pipe.vae.config.z_dim,
            job.height,
            job.width,
            job.num_frames,
            torch.float32,
            self.device,
            job.generator,
        )
        job.latents = latents
        for cond in (job.cond, job.uncond):
            if cond is not None:
                cond["condition"] = condition

    def model_input(self, x: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([x, cond["condition"]], dim=1)


WanAdapter.variants = {"WanImageToVideoPipeline": WanI2VAdapter}  # one entry point for T2V and I2V folders
