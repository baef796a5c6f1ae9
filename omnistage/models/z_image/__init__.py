"""Z-Image family: one diffusion stage (Qwen3 text encoder -> ZImageTransformer2DModel, flow matching -> VAE).

Default parameters are Z-Image-Turbo's published usage (9 steps, no CFG); a
base Z-Image checkpoint takes ``guidance_scale`` > 0 (and the ``cfg_*`` extras)
per request or through the deploy config's ``default_sampling_params``.
"""

from omnistage.info import PipelineInfo
from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.models.z_image.adapter import ZImageAdapter
from omnistage.models.z_image.tiny import build

PIPELINE = diffusers_pipeline(
    __file__,
    "z_image",
    "Z-Image(-Turbo): Qwen3 -> ZImageTransformer2DModel (few-step flow matching) -> VAE",
    classes="ZImagePipeline",
    adapter=ZImageAdapter,
    output="image",
    defaults={"num_inference_steps": 9, "guidance_scale": 0.0},
    # cfg_normalization: cap the guided prediction's norm at this multiple of the cond one (0: off);
    # cfg_truncation: no CFG once (1000 - t) / 1000 exceeds it (1: never) — ZImagePipeline's knobs;
    extra_body_params={"cfg_normalization": float, "cfg_truncation": float},
    # text-to-image only: the adapter refuses input images, so /v1/images/edits is not advertised
    info=PipelineInfo(image_edits=False),
)
PIPELINES = [PIPELINE]
TINY = {"z_image": build}

__all__ = ["PIPELINE", "PIPELINES", "TINY", "ZImageAdapter"]
