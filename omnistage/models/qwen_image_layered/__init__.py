"""Qwen-Image-Layered family: one diffusion stage (an RGBA image in -> Qwen2.5-VL prompt encoding ->
QwenImageTransformer2DModel over N + 1 latent frames -> N RGBA layers out).

Defaults are ``QwenImageLayeredPipeline.__call__``'s: 50 steps, ``true_cfg_scale`` 4.0 (CFG only with a negative
prompt), 4 layers, a 640² pixel area at the input image's aspect ratio.
"""

from omnistage.info import PipelineInfo
from omnistage.models.qwen_image_layered.adapter import MAX_LAYERS, QwenImageLayeredAdapter
from omnistage.models.qwen_image_layered.tiny import build
from omnistage.models.shared.diffusers_family import diffusers_pipeline

PIPELINE = diffusers_pipeline(
    __file__,
    "qwen_image_layered",
    "Qwen-Image-Layered: one RGBA image -> N RGBA layers (Qwen2.5-VL -> QwenImage MMDiT -> VAE)",
    classes="QwenImageLayeredPipeline",
    adapter=QwenImageLayeredAdapter,
    output="image",
    defaults={"num_inference_steps": 50, "true_cfg_scale": 4.0},
    # layers: how many RGBA layers (1..MAX_LAYERS); resolution: the pixel area's side (640 or 1024);
    # cfg_normalize: rescale the guided prediction to the cond one's norm; use_en_prompt: caption in English
    extra_body_params={"layers": int, "resolution": int, "cfg_normalize": bool, "use_en_prompt": bool},
    # one image in, its layers out: /v1/images/edits; a chat turn has no place for the layer count
    info=PipelineInfo(chat=False),
)
PIPELINES = [PIPELINE]
TINY = {"qwen_image_layered": build}

__all__ = ["MAX_LAYERS", "PIPELINE", "PIPELINES", "TINY", "QwenImageLayeredAdapter"]
