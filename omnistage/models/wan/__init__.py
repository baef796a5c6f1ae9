"""Wan 2.1 / 2.2 text- and image-to-video family: one diffusion stage (UMT5 [+ CLIP image] -> 3-D DiT -> video VAE)."""

from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.models.wan.adapter import DEFAULT_FPS, DEFAULT_NUM_FRAMES, WanAdapter
from omnistage.models.wan.tiny import build, build_i2v, build_wan22

PIPELINE = diffusers_pipeline(
    __file__,
    "wan",
    "Wan2.1/2.2 text/image-to-video: UMT5 -> WanTransformer3DModel (UniPC flow) -> AutoencoderKLWan",
    classes={"WanPipeline", "WanImageToVideoPipeline"},
    adapter=WanAdapter,
    output="video",
    # WanPipeline.__call__'s defaults; 16 fps is what the Wan releases export at
    defaults={"num_inference_steps": 50, "guidance_scale": 5.0, "num_frames": DEFAULT_NUM_FRAMES, "fps": DEFAULT_FPS},
)

PIPELINES = [PIPELINE]
TINY = {"wan": build, "wan22": build_wan22, "wan_i2v": build_i2v}

__all__ = ["WanAdapter", "PIPELINE", "PIPELINES", "TINY"]
