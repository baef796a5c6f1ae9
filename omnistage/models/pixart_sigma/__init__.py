"""PixArt-Σ family: one diffusion stage (T5 -> PixArtTransformer2DModel, DPM-Solver++ -> VAE).

Defaults are ``PixArtSigmaPipeline.__call__``'s: 20 steps, guidance 4.5 (CFG
when > 1, "" as the negative prompt), T5 length 300, and resolution binning
on: the requested size is served from the nearest trained aspect-ratio bin and
resized back (``use_resolution_binning: false`` in ``extra_body`` generates at
the requested size, a multiple of 16).
"""

from omnistage.info import PipelineInfo
from omnistage.models.pixart_sigma.tiny import build
from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.models.shared.pixart_adapter import PixArtSigmaAdapter

PIPELINE = diffusers_pipeline(
    __file__,
    "pixart_sigma",
    "PixArt-Σ: T5 -> PixArtTransformer2DModel (CFG, DPM-Solver++) -> VAE",
    classes="PixArtSigmaPipeline",
    adapter=PixArtSigmaAdapter,
    output="image",
    defaults={"num_inference_steps": 20, "guidance_scale": 4.5},  # PixArtSigmaPipeline.__call__'s
    # use_resolution_binning: serve from the nearest trained aspect-ratio bin, resized back (default true)
    extra_body_params={"use_resolution_binning": bool},
    info=PipelineInfo(image_edits=False),  # text-to-image only: every input image is refused
)
PIPELINES = [PIPELINE]
TINY = {"pixart_sigma": build}

__all__ = ["PIPELINE", "PIPELINES", "TINY", "PixArtSigmaAdapter"]
