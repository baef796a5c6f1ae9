"""The reference for the two-stage deploy: diffusers' published LTX-2 two-stage recipe, run on the tiny folder.

``LTX2Pipeline(output_type="latent")`` at half the size -> ``LTX2LatentUpsamplePipeline(latents=...,
output_type="latent")`` -> the scheduler swapped for one that takes its sigmas as they are -> ``LTX2Pipeline`` on
the upsampled latents and the first call's audio latents, with ``noise_scale`` and ``sigmas`` from
``STAGE_2_DISTILLED_SIGMA_VALUES``, 3 steps and ``guidance_scale=1.0``; one ``generator`` through both calls (the
distilled recipe passes it to both)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tests.stages.diffusion.helpers import gen, reference_pipeline

STG = {"spatio_temporal_guidance_blocks": [1]}  # the tiny DiT has 2 blocks (the release perturbs block 28)
# the request: a 64x64 video (the first pass draws 32x32, LTX2Pipeline's smallest), 5 frames
PROMPT, NEGATIVE, SEED = "a red cat", "blurry", 4
SIZE = dict(height=64, width=64)
FIRST = dict(num_frames=5, num_inference_steps=3, guidance_scale=3.0, max_sequence_length=16)
FPS = 25


def run_recipe(folder: Any) -> tuple[np.ndarray, np.ndarray]:
    """The recipe's frames (uint8, as its docs round them) and waveform [2, samples] for the request above."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2LatentUpsamplePipeline
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
    from diffusers.pipelines.ltx2.utils import STAGE_2_DISTILLED_SIGMA_VALUES

    torch.set_num_threads(1)
    pipe = reference_pipeline("LTX2Pipeline", str(folder))
    shared = dict(negative_prompt=NEGATIVE, frame_rate=float(FPS), max_sequence_length=16, **STG)
    generator = gen(SEED)
    video_latent, audio_latent = pipe(
        PROMPT,
        height=SIZE["height"] // 2,
        width=SIZE["width"] // 2,
        num_frames=FIRST["num_frames"],
        num_inference_steps=FIRST["num_inference_steps"],
        guidance_scale=FIRST["guidance_scale"],
        generator=generator,
        output_type="latent",
        return_dict=False,
        **shared,
    )
    upsampler = LTX2LatentUpsamplerModel.from_pretrained(str(folder), subfolder="latent_upsampler")
    upsample = LTX2LatentUpsamplePipeline(vae=pipe.vae, latent_upsampler=upsampler)
    upsample.set_progress_bar_config(disable=True)
    upscaled = upsample(latents=video_latent, output_type="latent", return_dict=False)[0]
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(
        pipe.scheduler.config, use_dynamic_shifting=False, shift_terminal=None
    )
    video, audio = pipe(
        PROMPT,
        latents=upscaled,
        audio_latents=audio_latent,
        num_inference_steps=3,
        noise_scale=STAGE_2_DISTILLED_SIGMA_VALUES[0],
        sigmas=STAGE_2_DISTILLED_SIGMA_VALUES,
        guidance_scale=1.0,
        generator=generator,
        output_type="np",
        return_dict=False,
        **shared,
    )
    return (video[0] * 255).round().astype(np.uint8), audio[0].float().numpy()
