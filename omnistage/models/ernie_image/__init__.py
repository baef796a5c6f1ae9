"""ERNIE-Image family: one diffusion stage (prompt enhancer -> Mistral 3 text encoder -> ErnieImageTransformer2DModel,
flow matching -> FLUX.2's VAE).

Defaults are ``ErnieImagePipeline.__call__``'s: 50 steps, guidance 4.0 (CFG when > 1, "" as the negative prompt),
1024x1024, and the prompt enhancer on (``use_pe``) when the folder has one.
"""

from omnistage.info import PipelineInfo
from omnistage.models.ernie_image.adapter import ErnieImageAdapter
from omnistage.models.ernie_image.tiny import build
from omnistage.models.shared.diffusers_family import diffusers_pipeline

PIPELINE = diffusers_pipeline(
    __file__,
    "ernie_image",
    "ERNIE-Image: prompt enhancer -> Mistral 3 -> ErnieImageTransformer2DModel (flow matching) -> VAE",
    classes="ErnieImagePipeline",
    adapter=ErnieImageAdapter,
    output="image",
    defaults={"num_inference_steps": 50, "guidance_scale": 4.0},
    # use_pe: rewrite the prompt with the folder's prompt enhancer first (default: when it has one); the rewrite
    # is answered as revised_prompt
    extra_body_params={"use_pe": bool},
    info=PipelineInfo(image_edits=False),  # text-to-image only: every input image is refused
)
PIPELINES = [PIPELINE]
TINY = {"ernie_image": build}

__all__ = ["PIPELINE", "PIPELINES", "TINY", "ErnieImageAdapter"]
