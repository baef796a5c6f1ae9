"""HunyuanVideo-1.5 text- and image-to-video: one diffusion stage (Qwen2.5-VL + ByT5 [+ SigLIP image] -> 3-D DiT ->
causal video VAE)."""

from omnistage.models.hunyuan_video15.adapter import (
    DEFAULT_FPS,
    DEFAULT_NUM_FRAMES,
    DEFAULT_STEPS,
    HunyuanVideo15Adapter,
)
from omnistage.models.hunyuan_video15.tiny import build, build_i2v
from omnistage.models.shared.diffusers_family import diffusers_pipeline

PIPELINE = diffusers_pipeline(
    __file__,
    "hunyuan_video15",
    "HunyuanVideo-1.5 text/image-to-video: Qwen2.5-VL + ByT5 -> HunyuanVideo15Transformer3DModel "
    "(flow Euler) -> AutoencoderKLHunyuanVideo15",
    classes={"HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"},
    adapter=HunyuanVideo15Adapter,
    output="video",
    # HunyuanVideo15Pipeline.__call__'s defaults; guidance_scale is the folder guider's unless a request sets one
    defaults={"num_inference_steps": DEFAULT_STEPS, "num_frames": DEFAULT_NUM_FRAMES, "fps": DEFAULT_FPS},
)

PIPELINES = [PIPELINE]
TINY = {"hunyuan_video15": build, "hunyuan_video15_i2v": build_i2v}

__all__ = ["HunyuanVideo15Adapter", "PIPELINE", "PIPELINES", "TINY"]
