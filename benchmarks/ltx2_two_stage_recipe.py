"""The baseline of ``diffusion_batching.py --family ltx2_two_stage``: diffusers' published LTX-2 two-stage recipe
as one callable with a pipeline's calling convention (``prompt``, ``generator``, the request's keywords), so the
benchmark's sequential and ideal runs call it as they call a diffusers pipeline.

One call: ``LTX2Pipeline(output_type="latent")`` at half the requested size -> ``LTX2LatentUpsamplePipeline(latents=
..., output_type="latent")`` -> ``LTX2Pipeline`` on the upsampled video latents and the first call's audio latents,
with the scheduler taking ``STAGE_2_DISTILLED_SIGMA_VALUES`` as they are (3 steps, ``noise_scale`` = the first
sigma) and ``guidance_scale`` 1; the same generator(s) through both denoising calls, as the recipe passes one.
A prompt list with a generator list runs each of the three calls once over the whole batch (the ideal)."""

from __future__ import annotations

from typing import Any

import torch

REFINE_STEPS = 3  # len(STAGE_2_DISTILLED_SIGMA_VALUES)
# what the refine call takes from the request; the rest (steps, size, frames, guidance) is the recipe's own
SHARED = ("negative_prompt", "frame_rate", "max_sequence_length", "spatio_temporal_guidance_blocks")


class LTX2TwoStageRecipe:
    def __init__(self, first: Any, upsample: Any, refine: Any) -> None:
        self.first, self.upsample, self.refine = first, upsample, refine

    @classmethod
    def from_pretrained(cls, folder: str, dtype: torch.dtype) -> LTX2TwoStageRecipe:
        from diffusers import FlowMatchEulerDiscreteScheduler, LTX2LatentUpsamplePipeline, LTX2Pipeline
        from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

        first = LTX2Pipeline.from_pretrained(folder, dtype=dtype)
        upsampler = LTX2LatentUpsamplerModel.from_pretrained(folder, subfolder="latent_upsampler", dtype=dtype)
        upsample = LTX2LatentUpsamplePipeline(vae=first.vae, latent_upsampler=upsampler)
        # the refine call's scheduler (the recipe swaps it in); the components are shared, not copied
        scheduler = FlowMatchEulerDiscreteScheduler.from_config(
            first.scheduler.config, use_dynamic_shifting=False, shift_terminal=None
        )
        refine = LTX2Pipeline(**{**first.components, "scheduler": scheduler})
        return cls(first, upsample, refine)

    @property
    def transformer(self) -> Any:
        return self.first.transformer

    def __getattr__(self, name: str) -> Any:  # the first pass's VAE factors and the like
        return getattr(self.__dict__["first"], name)

    def to(self, device: torch.device) -> LTX2TwoStageRecipe:
        for pipe in (self.first, self.upsample, self.refine):
            pipe.to(device)
        return self

    def set_progress_bar_config(self, **kw: Any) -> None:
        for pipe in (self.first, self.upsample, self.refine):
            pipe.set_progress_bar_config(**kw)

    def __call__(
        self,
        prompt: str | list[str],
        height: int,
        width: int,
        generator: Any = None,
        output_type: str = "np",
        **kw: Any,
    ) -> Any:
        """The recipe's frames and waveforms for a final ``height`` x ``width`` video; ``output_type="latent"``:
        the first pass's latents alone (what the first stage hands on)."""
        from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES

        video, audio = self.first(
            prompt,
            height=height // 2,
            width=width // 2,
            generator=generator,
            output_type="latent",
            return_dict=False,
            **kw,
        )
        if output_type == "latent":
            return video, audio
        upscaled = self.upsample(latents=video, output_type="latent", return_dict=False)[0]
        return self.refine(
            prompt,
            latents=upscaled,
            audio_latents=audio,
            num_inference_steps=REFINE_STEPS,
            noise_scale=STAGE_2_DISTILLED_SIGMA_VALUES[0],
            sigmas=STAGE_2_DISTILLED_SIGMA_VALUES,
            guidance_scale=1.0,
            generator=generator,
            output_type=output_type,
            return_dict=False,
            **{k: v for k, v in kw.items() if k in SHARED},
        )
