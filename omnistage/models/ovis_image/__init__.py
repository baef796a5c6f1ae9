"""Ovis-Image family: one diffusion stage (Qwen3 -> OvisImageTransformer2DModel, flow matching -> VAE).

Text-to-image only. Defaults are ``OvisImagePipeline.__call__``'s: 50 steps, guidance 5.0 (CFG when > 1, ""
as the negative prompt), 1024x1024, text length 256 (also its maximum).
"""

from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.ovis_image.tiny import build
from omnistage.models.shared.ovis_adapter import OvisImageAdapter
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

PIPELINE = Pipeline(
    name="ovis_image",
    description="Ovis-Image: Qwen3 -> OvisImageTransformer2DModel (MMDiT, CFG, flow matching) -> VAE",
    matches=lambda f: f.diffusers_class == "OvisImagePipeline",
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=OvisImageAdapter,
            output="image",
            can_output="image,latent",
            final=True,
            default_params={"num_inference_steps": 50, "guidance_scale": 5.0},
        )
    ],
    info=PipelineInfo(image_edits=False),  # text-to-image only: every input image is refused
    deploy_file=DEPLOY,
)
PIPELINES = [PIPELINE]
TINY = {"ovis_image": build}

__all__ = ["PIPELINE", "PIPELINES", "TINY", "OvisImageAdapter"]
