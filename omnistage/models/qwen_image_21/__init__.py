"""Qwen-Image-2.1 family: one diffusion stage (Qwen3-VL -> QwenImage21Transformer2DModel, flow matching ->
AutoencoderKLQwenImage21): text-to-image, and edits with condition images (``/v1/images/edits``; the output size
defaults to the last image's aspect ratio).

Defaults are ``QwenImage21Pipeline.__call__``'s: 40 steps, ``output_resolution`` 1024 (the square default size and
the area every condition image is resized to; ``extra_body``), ``true_cfg_scale`` 1 (true CFG only when a request
sends a scale > 1 and a negative prompt); ``guidance_scale`` is not used by this transformer.
"""

from omnistage.models.qwen_image_21.adapter import QwenImage21Adapter
from omnistage.models.qwen_image_21.tiny import build, build_lora
from omnistage.models.shared.diffusers_family import diffusers_pipeline

PIPELINE = diffusers_pipeline(
    __file__,
    "qwen_image_21",
    "Qwen-Image-2.1: Qwen3-VL -> QwenImage21Transformer2DModel (block-causal, true CFG; condition-image edits) -> VAE",
    classes="QwenImage21Pipeline",
    adapter=QwenImage21Adapter,
    output="image",
    defaults={"num_inference_steps": 40},
    # output_resolution: the default side length and the area condition images are resized to (default 1024)
    extra_body_params={"output_resolution": int},
)
PIPELINES = [PIPELINE]
TINY = {"qwen_image_21": build, "qwen_image_21_lora": build_lora}

__all__ = ["PIPELINE", "PIPELINES", "TINY", "QwenImage21Adapter"]
