"""LongCat-AudioDiT family: one diffusion stage (UMT5 -> LongCatAudioDiTTransformer, flow-match Euler ->
LongCatAudioDiTVae), text -> mono audio whose latent length is the requested duration."""

from omnistage.info import PipelineInfo
from omnistage.models.longcat_audio.adapter import LongCatAudioAdapter
from omnistage.models.longcat_audio.tiny import build
from omnistage.models.shared.diffusers_family import diffusers_pipeline

PIPELINE = diffusers_pipeline(
    __file__,
    "longcat_audio",
    "LongCat-AudioDiT: UMT5 -> LongCatAudioDiTTransformer (flow-match Euler) -> VAE (text -> audio)",
    classes="LongCatAudioDiTPipeline",
    adapter=LongCatAudioAdapter,
    output="audio",
    defaults={"num_inference_steps": 16, "guidance_scale": 4.0},  # LongCatAudioDiTPipeline.__call__'s
    latent_output=False,
    # duration: seconds of audio (diffusers' audio_duration_s; default the pipeline's estimate from the prompt)
    extra_body_params={"duration": float},
    info=PipelineInfo(chat=False),  # a prompt, not chat turns: /v1/audio/generate (docs/server.md)
)
PIPELINES = [PIPELINE]
TINY = {"longcat_audio": build}

__all__ = ["PIPELINE", "PIPELINES", "LongCatAudioAdapter", "TINY"]
