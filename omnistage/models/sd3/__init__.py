"""Stable Diffusion 3 / 3.5 family: one diffusion stage (MMDiT + flow matching)."""

from omnistage.info import PipelineInfo
from omnistage.models.sd3.tiny import build, build_lora
from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.models.shared.sd3_adapter import SD3Adapter

PIPELINE = diffusers_pipeline(
    __file__,
    "sd3",
    "Stable Diffusion 3/3.5: CLIP-L + CLIP-G + T5 -> MMDiT (flow matching) -> VAE",
    classes={"StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline"},
    adapter=SD3Adapter,
    output="image",
    defaults={"num_inference_steps": 28, "guidance_scale": 7.0},
    # mu: the flow-matching shift exponent (used when the scheduler has dynamic shifting)
    extra_body_params={"mu": float},
    # img2img edits each input image on its own (diffusers' image batch): /v1/images/edits reads n per image
    info=PipelineInfo(image_batch=True),
)
PIPELINES = [PIPELINE]
TINY = {"sd3": build, "sd3_lora": build_lora}

__all__ = ["SD3Adapter", "PIPELINE", "PIPELINES", "TINY"]
