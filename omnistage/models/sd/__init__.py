"""Stable Diffusion 1.5 and SDXL family: one diffusion stage (CLIP text -> UNet -> VAE)."""

from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.sd.adapter import SDAdapter, SDXLAdapter
from omnistage.models.sd.tiny import build_sd15, build_sdxl
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

SD_CLASSES = {
    "StableDiffusionPipeline",
    "StableDiffusionImg2ImgPipeline",
    "StableDiffusionXLPipeline",
    "StableDiffusionXLImg2ImgPipeline",
}

PIPELINE = Pipeline(
    name="sd",
    description="Stable Diffusion 1.5 / SDXL: CLIP text encoder(s) -> UNet -> VAE",
    matches=lambda f: f.diffusers_class in SD_CLASSES,
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=SDAdapter,
            output="image",
            can_output="image,latent",
            final=True,
            default_params={"num_inference_steps": 30, "guidance_scale": 7.5},
        )
    ],
    # SDXL micro-conditioning, each a pair of ints (defaults: the output size and (0, 0))
    extra_body_params={"original_size": list, "crops_coords_top_left": list, "target_size": list},
    # img2img edits each input image on its own (diffusers' image batch): /v1/images/edits reads n per image
    info=PipelineInfo(image_batch=True),
    deploy_file=DEPLOY,
)
PIPELINES = [PIPELINE]
TINY = {"sd15": build_sd15, "sdxl": build_sdxl}

__all__ = ["SDAdapter", "SDXLAdapter", "PIPELINE", "PIPELINES", "TINY"]
