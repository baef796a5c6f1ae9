"""Wan 2.1 / 2.2 text- and image-to-video family: one diffusion stage (UMT5 [+ CLIP image] -> 3-D DiT -> video VAE)."""

from omnistage.models.wan.adapter import DEFAULT_FPS, DEFAULT_NUM_FRAMES, WanAdapter
from omnistage.pipeline import Pipeline, StageSpec, register_pipeline

WAN_CLASSES = {"WanPipeline", "WanImageToVideoPipeline"}

PIPELINE = register_pipeline(Pipeline(
    name="wan",
    description="Wan2.1/2.2 text/image-to-video: UMT5 -> WanTransformer3DModel (UniPC flow) -> AutoencoderKLWan",
    matches=lambda f: f.diffusers_class in WAN_CLASSES,
    stages=[StageSpec(0, kind="diffusion", adapter=WanAdapter, output="video", can_output="video,latent", final=True,
                      # WanPipeline.__call__'s defaults; 16 fps is what the Wan releases export at
                      default_params={"num_inference_steps": 50, "guidance_scale": 5.0,
                                      "num_frames": DEFAULT_NUM_FRAMES, "fps": DEFAULT_FPS})],
))

__all__ = ["WanAdapter", "PIPELINE"]
