"""Stable Audio family: one diffusion stage (T5 + seconds conditioning -> StableAudioDiTModel -> Oobleck VAE),
text -> stereo audio of a requested duration."""

from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.stable_audio.adapter import StableAudioAdapter
from omnistage.models.stable_audio.tiny import build
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

PIPELINE = Pipeline(
    name="stable_audio",
    description="Stable Audio: T5 + seconds -> StableAudioDiTModel (EDM DPM-Solver++) -> Oobleck VAE (text -> audio)",
    matches=lambda f: f.diffusers_class == "StableAudioPipeline",
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=StableAudioAdapter,
            output="audio",
            final=True,
            default_params={"num_inference_steps": 100, "guidance_scale": 7.0},  # StableAudioPipeline.__call__'s
        )
    ],
    # duration: seconds of audio from the start (diffusers' audio_end_in_s; default the model's longest clip)
    extra_body_params={"duration": float},
    info=PipelineInfo(chat=False),  # a prompt, not chat turns: /v1/audio/generate (docs/server.md)
    deploy_file=DEPLOY,
)
PIPELINES = [PIPELINE]
TINY = {"stable_audio": build}

__all__ = ["PIPELINE", "PIPELINES", "StableAudioAdapter", "TINY"]
