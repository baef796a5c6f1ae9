"""Wan 2.1 / 2.2 text- and image-to-video family: one diffusion stage (UMT5 [+ CLIP image] -> 3-D DiT -> video VAE)."""

from pathlib import Path

from omnistage.models.wan.adapter import DEFAULT_FPS, DEFAULT_NUM_FRAMES, WanAdapter
from omnistage.models.wan.tiny import build, build_i2v, build_wan22
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

WAN_CLASSES = {"WanPipeline", "WanImageToVideoPipeline"}

PIPELINE = Pipeline(
    name="wan",
    description="Wan2.1/2.2 text/image-to-video: UMT5 -> WanTransformer3DModel (UniPC flow) -> AutoencoderKLWan",
    matches=lambda f: f.diffusers_class in WAN_CLASSES,
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=WanAdapter,
            output="video",
            can_output="video,latent",
            final=True,
            # WanPipeline.__call__'s defaults; 16 fps is what the Wan releases export at
            default_params={
                "num_inference_steps": 50,
                "guidance_scale": 5.0,
                "num_frames": DEFAULT_NUM_FRAMES,
                "fps": DEFAULT_FPS,
            },
        )
    ],
    deploy_file=DEPLOY,
)

PIPELINES = [PIPELINE]
TINY = {"wan": build, "wan22": build_wan22, "wan_i2v": build_i2v}

__all__ = ["WanAdapter", "PIPELINE", "PIPELINES", "TINY"]
