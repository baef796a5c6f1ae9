"""LongCat-AudioDiT family: one diffusion stage (UMT5 -> LongCatAudioDiTTransformer, flow-match Euler ->
LongCatAudioDiTVae), text -> mono audio whose latent length is the requested duration."""

from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.longcat_audio.adapter import LongCatAudioAdapter
from omnistage.models.longcat_audio.tiny import build
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

PIPELINE = Pipeline(
    name="longcat_audio",
    description="LongCat-AudioDiT: UMT5 -> LongCatAudioDiTTransformer (flow-match Euler) -> VAE (text -> audio)",
    matches=lambda f: f.diffusers_class == "LongCatAudioDiTPipeline",
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=LongCatAudioAdapter,
            output="audio",
            final=True,
            default_params={"num_inference_steps": 16, "guidance_scale": 4.0},  # LongCatAudioDiTPipeline.__call__'s
        )
    ],
    # duration: seconds of audio (diffusers' audio_duration_s; default the pipeline's estimate from the prompt)
    extra_body_params={"duration": float},
    info=PipelineInfo(chat=False),  # a prompt, not chat turns: /v1/audio/generate (docs/server.md)
    deploy_file=DEPLOY,
)
PIPELINES = [PIPELINE]
TINY = {"longcat_audio": build}

__all__ = ["PIPELINE", "PIPELINES", "LongCatAudioAdapter", "TINY"]
