"""Stable Audio family: one diffusion stage (T5 + seconds conditioning -> StableAudioDiTModel -> Oobleck VAE),
text -> stereo audio of a requested duration."""

from omnistage.info import PipelineInfo
from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.models.stable_audio.adapter import StableAudioAdapter
from omnistage.models.stable_audio.tiny import build

PIPELINE = diffusers_pipeline(
    __file__,
    "stable_audio",
    "Stable Audio: T5 + seconds -> StableAudioDiTModel (EDM DPM-Solver++) -> Oobleck VAE (text -> audio)",
    classes="StableAudioPipeline",
    adapter=StableAudioAdapter,
    output="audio",
    defaults={"num_inference_steps": 100, "guidance_scale": 7.0},  # StableAudioPipeline.__call__'s
    latent_output=False,
    # duration: seconds of audio from the start (diffusers' audio_end_in_s; default the model's longest clip)
    extra_body_params={"duration": float},
    info=PipelineInfo(chat=False),  # a prompt, not chat turns: /v1/audio/generate (docs/server.md)
)
PIPELINES = [PIPELINE]
TINY = {"stable_audio": build}

__all__ = ["PIPELINE", "PIPELINES", "StableAudioAdapter", "TINY"]
