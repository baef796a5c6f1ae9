"""HunyuanVideo-1.5 text- and image-to-video: one diffusion stage (Qwen2.5-VL + ByT5 [+ SigLIP image] -> 3-D DiT ->
causal video VAE)."""

from pathlib import Path

from omnistage.models.hunyuan_video15.adapter import (
    DEFAULT_FPS,
    DEFAULT_NUM_FRAMES,
    DEFAULT_STEPS,
    HunyuanVideo15Adapter,
)
from omnistage.models.hunyuan_video15.tiny import build, build_i2v
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

CLASSES = {"HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"}

PIPELINE = Pipeline(
    name="hunyuan_video15",
    description="HunyuanVideo-1.5 text/image-to-video: Qwen2.5-VL + ByT5 -> HunyuanVideo15Transformer3DModel "
    "(flow Euler) -> AutoencoderKLHunyuanVideo15",
    matches=lambda f: f.diffusers_class in CLASSES,
    # HunyuanVideo15Pipeline.__call__'s defaults; guidance_scale is the folder guider's unless a request sets one
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=HunyuanVideo15Adapter,
            output="video",
            can_output="video,latent",
            final=True,
            default_params={"num_inference_steps": DEFAULT_STEPS, "num_frames": DEFAULT_NUM_FRAMES, "fps": DEFAULT_FPS},
        )
    ],
    deploy_file=DEPLOY,
)

PIPELINES = [PIPELINE]
TINY = {"hunyuan_video15": build, "hunyuan_video15_i2v": build_i2v}

__all__ = ["HunyuanVideo15Adapter", "PIPELINE", "PIPELINES", "TINY"]
