"""ERNIE-Image family: one diffusion stage (prompt enhancer -> Mistral 3 text encoder -> ErnieImageTransformer2DModel,
flow matching -> FLUX.2's VAE).

Defaults are ``ErnieImagePipeline.__call__``'s: 50 steps, guidance 4.0 (CFG when > 1, "" as the negative prompt),
1024x1024, and the prompt enhancer on (``use_pe``) when the folder has one.
"""

from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.ernie_image.adapter import ErnieImageAdapter
from omnistage.models.ernie_image.tiny import build
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

PIPELINE = Pipeline(
    name="ernie_image",
    description="ERNIE-Image: prompt enhancer -> Mistral 3 -> ErnieImageTransformer2DModel (flow matching) -> VAE",
    matches=lambda f: f.diffusers_class == "ErnieImagePipeline",
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=ErnieImageAdapter,
            output="image",
            can_output="image,latent",
            final=True,
            default_params={"num_inference_steps": 50, "guidance_scale": 4.0},
        )
    ],
    # use_pe: rewrite the prompt with the folder's prompt enhancer first (default: when it has one); the rewrite
    # is answered as revised_prompt
    extra_body_params={"use_pe": bool},
    info=PipelineInfo(image_edits=False),  # text-to-image only: every input image is refused
    deploy_file=DEPLOY,
)
PIPELINES = [PIPELINE]
TINY = {"ernie_image": build}

__all__ = ["PIPELINE", "PIPELINES", "TINY", "ErnieImageAdapter"]
