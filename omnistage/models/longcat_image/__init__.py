"""LongCat-Image family: one diffusion stage (Qwen2.5-VL -> LongCatImageTransformer2DModel, flow matching -> VAE).

- ``longcat_image``: text-to-image (``LongCatImagePipeline``). CFG when ``guidance_scale`` > 1, with CFG
  renorm (``enable_cfg_renorm``, ``cfg_renorm_min``) as diffusers; prompt rewriting by the text encoder
  (``enable_prompt_rewrite``) only when a request asks (diffusers' default is on: see adapter.py).
- ``longcat_image_edit``: one input image (``LongCatImageEditPipeline``, ``/v1/images/edits``); the output size
  follows the image (its aspect ratio at about 1024x1024).

Defaults are ``__call__``'s: 50 steps, guidance 4.5; 1024x1024 for text-to-image.
"""

from omnistage.models.longcat_image.adapter import LongCatImageAdapter
from omnistage.models.longcat_image.edit import LongCatImageEditAdapter
from omnistage.models.longcat_image.tiny import build, build_edit
from omnistage.models.shared.diffusers_family import diffusers_pipeline

DEFAULTS = {"num_inference_steps": 50, "guidance_scale": 4.5}  # both pipelines' __call__ defaults

PIPELINE = diffusers_pipeline(
    __file__,
    "longcat_image",
    "LongCat-Image: Qwen2.5-VL -> LongCatImageTransformer2DModel (CFG with renorm, flow matching) -> VAE",
    classes="LongCatImagePipeline",
    adapter=LongCatImageAdapter,
    output="image",
    defaults=DEFAULTS,
    # enable_cfg_renorm: cap the guided prediction's norm by the conditional one's (default true), down to
    # cfg_renorm_min (0..1, default 0); enable_prompt_rewrite: let the text encoder rewrite the prompt first
    # (default false here: a whole LLM generation inside the denoiser's loop)
    extra_body_params={"enable_cfg_renorm": bool, "cfg_renorm_min": float, "enable_prompt_rewrite": bool},
)

EDIT = diffusers_pipeline(
    __file__,
    "longcat_image_edit",
    "LongCat-Image-Edit: one input image (seen by Qwen2.5-VL and joining the DiT's sequence) -> VAE",
    classes="LongCatImageEditPipeline",
    adapter=LongCatImageEditAdapter,
    output="image",
    defaults=DEFAULTS,
)

PIPELINES = [PIPELINE, EDIT]
TINY = {"longcat_image": build, "longcat_image_edit": build_edit}

__all__ = ["EDIT", "PIPELINE", "PIPELINES", "TINY", "LongCatImageAdapter", "LongCatImageEditAdapter"]
