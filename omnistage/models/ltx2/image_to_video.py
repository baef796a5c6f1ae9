"""LTX-2 image-to-video (``LTX2ImageToVideoPipeline``) for the diffusion engine: ``LTX2Adapter``'s loop, with the
input image as the first latent frame."""

from __future__ import annotations

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.ltx2.adapter import LTX2Adapter
from omnistage.models.ltx2.request import LTX2Job
from omnistage.stages.diffusion.adapter import check_first_frame


# Image-to-video (LTX2ImageToVideoPipeline): the same loop; the input image, VAE-encoded (its mode), is the first
# latent frame, never noised and never stepped, and the DiT sees timestep 0 on its tokens.
class LTX2I2VAdapter(LTX2Adapter):
    pipeline_class_name = "LTX2ImageToVideoPipeline"

    def validate(self, job: LTX2Job) -> None:
        check_first_frame(job)
        if job.params.strength is not None:
            raise InvalidRequestError("strength", "not used by image-to-video (the image is the first frame)")
        self.validate_video(job)
        crf = job.params.extra_args.get("image_crf")
        if crf is not None and not 0 <= int(crf) <= 51:
            raise InvalidRequestError("image_crf", f"{crf} is not an H.264 CRF (0-51; 0 skips the re-compression)")

    def init_latents(self, job: LTX2Job) -> None:
        from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf, resolve_default_image_crf

        pipe = self.pipe
        crf = job.params.extra_args.get("image_crf")
        crf = int(crf) if crf is not None else resolve_default_image_crf(pipe.text_encoder)
        image = job.images[0]
        if crf != 0:  # re-compressed as the model saw its training frames
            from PIL import Image

            image = Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), crf))
        image = pipe.video_processor.preprocess(image, height=job.height, width=job.width)
        image = image.to(device=self.device, dtype=self.model_dtype)
        video, mask = self.video_noise(job, image)
        for cond in (job.cond, job.uncond):
            if cond is not None:
                cond["frame_mask"] = mask
        self.set_latents(job, video)

    def video_timestep(self, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return t.unsqueeze(-1) * (1 - cond["frame_mask"])

    def keep_given_frames(self, velocity: torch.Tensor, job: LTX2Job) -> None:
        f = self.pipe.vae_spatial_compression_ratio
        velocity[:, : (job.height // f) * (job.width // f) * self.model.config.in_channels] = 0.0  # x + dt * 0 == x


LTX2Adapter.variants = {"LTX2ImageToVideoPipeline": LTX2I2VAdapter}  # one entry point for T2V and I2V folders
