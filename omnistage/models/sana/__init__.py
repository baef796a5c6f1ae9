"""Sana family: one diffusion stage (Gemma-2 -> SanaTransformer2DModel, flow DPM-Solver++ -> DC-AE).

Defaults are ``SanaPipeline.__call__``'s: 20 steps, guidance 4.5 (CFG when
> 1, "" as the negative prompt), 1024x1024, text length 300 after the
pipeline's complex-human instruction, and resolution binning on
(``use_resolution_binning: false`` in ``extra_body`` generates at the requested
size, a multiple of 32).
"""

from omnistage.info import PipelineInfo
from omnistage.models.sana.adapter import SanaAdapter
from omnistage.models.sana.tiny import build, build_lora
from omnistage.models.shared.diffusers_family import diffusers_pipeline

PIPELINE = diffusers_pipeline(
    __file__,
    "sana",
    "Sana: Gemma-2 -> SanaTransformer2DModel (linear attention, CFG, flow DPM-Solver++) -> DC-AE",
    classes="SanaPipeline",
    adapter=SanaAdapter,
    output="image",
    defaults={"num_inference_steps": 20, "guidance_scale": 4.5},  # SanaPipeline.__call__'s
    # use_resolution_binning: serve from the nearest trained aspect-ratio bin, resized back (default true)
    extra_body_params={"use_resolution_binning": bool},
    info=PipelineInfo(image_edits=False),  # text-to-image only: every input image is refused
)
PIPELINES = [PIPELINE]
TINY = {"sana": build, "sana_lora": build_lora}

__all__ = ["PIPELINE", "PIPELINES", "TINY", "SanaAdapter"]
