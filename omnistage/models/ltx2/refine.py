"""The two diffusion stages of LTX-2's two-stage recipe (``handoff.py`` says what crosses between them).

First pass: ``LTX2Adapter`` as it is, ending in the latents ``LTX2Pipeline(output_type="latent")`` returns. Refine
pass: the same denoising loop, started from those latents upsampled 2x by the checkpoint's latent upsampler and
renoised to the first sigma of diffusers' ``STAGE_2_DISTILLED_SIGMA_VALUES``, stepped on those sigmas as they are
(the recipe's scheduler swap: no resolution shift, no terminal stretch), with video CFG off by default
(``guidance_scale`` 1); the audio CFG, STG and modality-isolation guidance stay at the request's (diffusers'
defaults in the recipe).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.ltx2.adapter import LTX2Adapter
from omnistage.models.ltx2.handoff import UPSAMPLER_FOLDER, LTX2Latents
from omnistage.models.ltx2.request import LTX2Job
from omnistage.models.shared.input_checks import refuse_params


class LTX2FirstPassAdapter(LTX2Adapter):
    """Text-to-video only: an image-to-video folder's first frame would need conditioning in the refine pass too."""

    variants: ClassVar[dict[str, type]] = {}

    def pack_latents(self, job: LTX2Job) -> dict[str, Any]:
        """``LTX2Pipeline(output_type="latent")``'s pair: the packed rows unpacked and denormalised."""
        pipe, f = self.pipe, self.pipe.vae_spatial_compression_ratio
        video, audio = self.split(job.latents, job.shapes)
        video = pipe._unpack_latents(
            video,
            self.latent_frames(job),
            job.height // f,
            job.width // f,
            pipe.transformer_spatial_patch_size,
            pipe.transformer_temporal_patch_size,
        )
        video = pipe._denormalize_latents(
            video, pipe.vae.latents_mean, pipe.vae.latents_std, pipe.vae.config.scaling_factor
        )
        audio = pipe._denormalize_audio_latents(audio, pipe.audio_vae.latents_mean, pipe.audio_vae.latents_std)
        audio = pipe._unpack_audio_latents(audio, job.audio_frames, num_mel_bins=self.mel_bins)
        return {"latent": LTX2Latents(video, audio, job.generator.get_state())}


class LTX2RefineAdapter(LTX2Adapter):
    variants: ClassVar[dict[str, type]] = {}

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        from diffusers import FlowMatchEulerDiscreteScheduler
        from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES

        # the recipe's refine scheduler: its sigmas as given
        pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(
            pipe.scheduler.config, use_dynamic_shifting=False, shift_terminal=None
        )
        super().__init__(pipe, dtype, device)
        self.refine_sigmas = list(STAGE_2_DISTILLED_SIGMA_VALUES)
        self.upsampler: Any = None  # set by load

    @classmethod
    def load(cls, folder: str, dtype: torch.dtype, device: torch.device, quantization: Any = None) -> LTX2RefineAdapter:
        from pathlib import Path

        from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

        path = Path(folder) / UPSAMPLER_FOLDER
        if not (path / "config.json").is_file():
            raise ValueError(f"{path}: the two-stage deploy needs the checkpoint's latent upsampler there")
        adapter = super().load(folder, dtype, device, quantization)
        upsampler = LTX2LatentUpsamplerModel.from_pretrained(path, torch_dtype=dtype).to(device).eval()
        if upsampler.config.temporal_upsample or not upsampler.config.spatial_upsample:
            raise ValueError(f"{path}: a spatial (not temporal) latent upsampler is what the refine pass takes")
        adapter.upsampler = upsampler
        return adapter

    def validate(self, job: LTX2Job) -> None:
        p = job.params
        own = "sampling_params_list[1]."  # the request's knobs go to the first pass: these come from this entry
        refuse_params(
            p, ("height", "width", "num_frames"), "the refine pass draws at the size of the upsampled first pass", own
        )
        if p.num_inference_steps != len(self.refine_sigmas):
            raise InvalidRequestError(
                own + "num_inference_steps",
                f"{p.num_inference_steps}; the refine pass runs the recipe's {len(self.refine_sigmas)} sigmas",
            )
        super().validate(job)  # guidance, frame rate, prompt length (the geometry is the latents', below)
        latents = LTX2Latents.from_any(job.inputs.get("latents"))
        _, _, frames, height, width = latents.video.shape
        f = self.pipe.vae_spatial_compression_ratio
        job.height, job.width = self.upsampled(height) * f, self.upsampled(width) * f
        job.num_frames = (frames - 1) * self.pipe.vae_temporal_compression_ratio + 1
        job.audio_frames = latents.audio.shape[2]
        job.generator = latents.new_generator()

    def upsampled(self, n: int) -> int:
        """A latent side after the upsampler: x num (pixel shuffle), then a stride-den blur with padding 2."""
        resampler = self.upsampler.upsampler  # a SpatialRationalResampler, or a plain 2x pixel shuffle
        num, den = getattr(resampler, "num", 2), getattr(resampler, "den", 1)
        return -(-n * num // den)

    def sigmas(self, job: LTX2Job) -> Any:
        return self.refine_sigmas

    def init_latents(self, job: LTX2Job) -> None:
        """``LTX2LatentUpsamplePipeline(latents=..., output_type="latent")``, then ``LTX2Pipeline.__call__``'s
        latent preparation with ``latents``, ``audio_latents`` and ``noise_scale`` = the first sigma given."""
        pipe, latents = self.pipe, LTX2Latents.from_any(job.inputs["latents"])
        video = latents.video.to(device=self.device, dtype=torch.float32)
        video = self.upsampler(video.to(self.upsampler.dtype))
        noise_scale = self.refine_sigmas[0]
        video = pipe.prepare_latents(
            1,
            self.model.config.in_channels,
            job.height,
            job.width,
            job.num_frames,
            noise_scale,
            torch.float32,
            self.device,
            job.generator,
            video,
        )
        audio = pipe.prepare_audio_latents(
            1,
            num_channels_latents=self.audio_channels,
            audio_latent_length=job.audio_frames,
            num_mel_bins=pipe.audio_vae.config.mel_bins,
            noise_scale=noise_scale,
            dtype=torch.float32,
            device=self.device,
            generator=job.generator,
            latents=latents.audio.to(self.device),
        )
        job.shapes = self.shapes(self.geometry(job)[0].tolist())
        job.latents = torch.cat([video.flatten(1), audio.flatten(1)], dim=1)
