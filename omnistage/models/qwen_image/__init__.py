"""Qwen-Image family: one diffusion stage (Qwen2.5-VL text encoder -> QwenImageTransformer2DModel -> VAE).

Three declarations, matched by the folder's diffusers pipeline class:

- ``qwen_image``: Qwen-Image and Qwen-Image-2512 (``QwenImagePipeline``), text-to-image;
- ``qwen_image_edit``: Qwen-Image-Edit (``QwenImageEditPipeline``), one input image;
- ``qwen_image_edit_plus``: Qwen-Image-Edit-2509 / -2511 (``QwenImageEditPlusPipeline``), 1-3 input images.

Defaults are diffusers' ``__call__`` defaults: 50 steps, and true CFG at
``true_cfg_scale`` 4.0 when the request has a negative prompt (none without
one, as diffusers does). An explicit ``true_cfg_scale`` > 1 without a negative
prompt is refused (400 naming ``negative_prompt``) rather than silently
ignored. ``guidance_scale`` has no effect on these models (diffusers ignores it
too). Edit requests are ``/v1/images/edits`` with the input images; the output
size defaults to the (last) input image's aspect ratio at ~1024x1024 pixels.
"""

from omnistage.models.qwen_image.adapter import QwenImageAdapter, QwenImageEditAdapter, QwenImageEditPlusAdapter
from omnistage.models.qwen_image.tiny import build, build_edit, build_edit_plus
from omnistage.models.shared.diffusers_family import diffusers_pipeline

DEFAULTS = {"num_inference_steps": 50}  # the pipelines' __call__ default (true_cfg_scale: see above)

PIPELINE = diffusers_pipeline(
    __file__,
    "qwen_image",
    "Qwen-Image(-2512): Qwen2.5-VL -> QwenImageTransformer2DModel (true CFG, flow matching) -> VAE",
    classes="QwenImagePipeline",
    adapter=QwenImageAdapter,
    output="image",
    defaults=DEFAULTS,
)

EDIT = diffusers_pipeline(
    __file__,
    "qwen_image_edit",
    "Qwen-Image-Edit: one input image through the Qwen2.5-VL vision tower and the VAE -> edited image",
    classes="QwenImageEditPipeline",
    adapter=QwenImageEditAdapter,
    output="image",
    defaults=DEFAULTS,
)

EDIT_PLUS = diffusers_pipeline(
    __file__,
    "qwen_image_edit_plus",
    'Qwen-Image-Edit-2509/-2511: 1-3 input images ("Picture i") -> edited / composed image',
    classes="QwenImageEditPlusPipeline",
    adapter=QwenImageEditPlusAdapter,
    output="image",
    defaults=DEFAULTS,
)

PIPELINES = [PIPELINE, EDIT, EDIT_PLUS]
TINY = {"qwen_image": build, "qwen_image_edit": build_edit, "qwen_image_edit_plus": build_edit_plus}

__all__ = [
    "EDIT",
    "EDIT_PLUS",
    "PIPELINE",
    "PIPELINES",
    "TINY",
    "QwenImageAdapter",
    "QwenImageEditAdapter",
    "QwenImageEditPlusAdapter",
]
