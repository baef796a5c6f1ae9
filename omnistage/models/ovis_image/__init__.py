"""Ovis-Image family: one diffusion stage (Qwen3 -> OvisImageTransformer2DModel, flow matching -> VAE).

Text-to-image only. Defaults are ``OvisImagePipeline.__call__``'s: 50 steps, guidance 5.0 (CFG when > 1, ""
as the negative prompt), 1024x1024, text length 256 (also its maximum).
"""

from omnistage.info import PipelineInfo
from omnistage.models.ovis_image.tiny import build
from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.models.shared.ovis_adapter import OvisImageAdapter

PIPELINE = diffusers_pipeline(
    __file__,
    "ovis_image",
    "Ovis-Image: Qwen3 -> OvisImageTransformer2DModel (MMDiT, CFG, flow matching) -> VAE",
    classes="OvisImagePipeline",
    adapter=OvisImageAdapter,
    output="image",
    defaults={"num_inference_steps": 50, "guidance_scale": 5.0},
    info=PipelineInfo(image_edits=False),  # text-to-image only: every input image is refused
)
PIPELINES = [PIPELINE]
TINY = {"ovis_image": build}

__all__ = ["PIPELINE", "PIPELINES", "TINY", "OvisImageAdapter"]
