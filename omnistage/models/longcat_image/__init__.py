"""LongCat-Image family: one diffusion stage (Qwen2.5-VL -> LongCatImageTransformer2DModel, flow matching -> VAE).

- ``longcat_image``: text-to-image (``LongCatImagePipeline``). CFG when ``guidance_scale`` > 1, with CFG
  renorm (``enable_cfg_renorm``, ``cfg_renorm_min``) as diffusers; prompt rewriting by the text encoder
  (``enable_prompt_rewrite``) only when a request asks (diffusers' default is on: see adapter.py).
- ``longcat_image_edit``: one input image (``LongCatImageEditPipeline``, ``/v1/images/edits``); the output size
  follows the image (its aspect ratio at about 1024x1024).

Defaults are ``__call__``'s: 50 steps, guidance 4.5; 1024x1024 for text-to-image.
"""

from pathlib import Path

from omnistage.models.longcat_image.adapter import LongCatImageAdapter
from omnistage.models.longcat_image.edit import LongCatImageEditAdapter
from omnistage.models.longcat_image.tiny import build, build_edit
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment
DEFAULT_PARAMS = {"num_inference_steps": 50, "guidance_scale": 4.5}  # both pipelines' __call__ defaults


def _stage(adapter: type[LongCatImageAdapter]) -> StageSpec:
    return StageSpec(
        0,
        kind="diffusion",
        adapter=adapter,
        output="image",
        can_output="image,latent",
        final=True,
        default_params=dict(DEFAULT_PARAMS),
    )


PIPELINE = Pipeline(
    name="longcat_image",
    description="LongCat-Image: Qwen2.5-VL -> LongCatImageTransformer2DModel (CFG with renorm, flow matching) -> VAE",
    matches=lambda f: f.diffusers_class == "LongCatImagePipeline",
    stages=[_stage(LongCatImageAdapter)],
    # enable_cfg_renorm: cap the guided prediction's norm by the conditional one's (default true), down to
    # cfg_renorm_min (0..1, default 0); enable_prompt_rewrite: let the text encoder rewrite the prompt first
    # (default false here: a whole LLM generation inside the denoiser's loop)
    extra_body_params={"enable_cfg_renorm": bool, "cfg_renorm_min": float, "enable_prompt_rewrite": bool},
    deploy_file=DEPLOY,
)

EDIT = Pipeline(
    name="longcat_image_edit",
    description="LongCat-Image-Edit: one input image (seen by Qwen2.5-VL and joining the DiT's sequence) -> VAE",
    matches=lambda f: f.diffusers_class == "LongCatImageEditPipeline",
    stages=[_stage(LongCatImageEditAdapter)],
    deploy_file=DEPLOY,
)

PIPELINES = [PIPELINE, EDIT]
TINY = {"longcat_image": build, "longcat_image_edit": build_edit}

__all__ = ["EDIT", "PIPELINE", "PIPELINES", "TINY", "LongCatImageAdapter", "LongCatImageEditAdapter"]
