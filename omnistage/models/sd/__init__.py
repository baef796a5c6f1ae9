"""Stable Diffusion 1.5 and SDXL family: one diffusion stage (CLIP text -> UNet -> VAE)."""

from omnistage.info import PipelineInfo
from omnistage.models.sd.adapter import SDAdapter, SDXLAdapter
from omnistage.models.sd.tiny import build_sd15, build_sdxl
from omnistage.models.shared.diffusers_family import diffusers_pipeline

PIPELINE = diffusers_pipeline(
    __file__,
    "sd",
    "Stable Diffusion 1.5 / SDXL: CLIP text encoder(s) -> UNet -> VAE",
    classes={
        "StableDiffusionPipeline",
        "StableDiffusionImg2ImgPipeline",
        "StableDiffusionXLPipeline",
        "StableDiffusionXLImg2ImgPipeline",
    },
    adapter=SDAdapter,
    output="image",
    defaults={"num_inference_steps": 30, "guidance_scale": 7.5},
    # SDXL micro-conditioning, each a pair of ints (defaults: the output size and (0, 0))
    extra_body_params={"original_size": list, "crops_coords_top_left": list, "target_size": list},
    # img2img edits each input image on its own (diffusers' image batch): /v1/images/edits reads n per image
    info=PipelineInfo(image_batch=True),
)
PIPELINES = [PIPELINE]
TINY = {"sd15": build_sd15, "sdxl": build_sdxl}

__all__ = ["SDAdapter", "SDXLAdapter", "PIPELINE", "PIPELINES", "TINY"]
