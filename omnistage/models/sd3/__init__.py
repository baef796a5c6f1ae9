"""Stable Diffusion 3 / 3.5 family: one diffusion stage (MMDiT + flow matching)."""

from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.sd3.tiny import build, build_lora
from omnistage.models.shared.sd3_adapter import SD3Adapter
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

SD3_CLASSES = {"StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline"}

PIPELINE = Pipeline(
    name="sd3",
    description="Stable Diffusion 3/3.5: CLIP-L + CLIP-G + T5 -> MMDiT (flow matching) -> VAE",
    matches=lambda f: f.diffusers_class in SD3_CLASSES,
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=SD3Adapter,
            output="image",
            can_output="image,latent",
            final=True,
            default_params={"num_inference_steps": 28, "guidance_scale": 7.0},
        )
    ],
    # mu: the flow-matching shift exponent (used when the scheduler has dynamic shifting)
    extra_body_params={"mu": float},
    # img2img edits each input image on its own (diffusers' image batch): /v1/images/edits reads n per image
    info=PipelineInfo(image_batch=True),
    deploy_file=DEPLOY,
)
PIPELINES = [PIPELINE]
TINY = {"sd3": build, "sd3_lora": build_lora}

__all__ = ["SD3Adapter", "PIPELINE", "PIPELINES", "TINY"]
