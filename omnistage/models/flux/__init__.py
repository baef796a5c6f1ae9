"""FLUX.1 family: one diffusion stage (CLIP-L pooled + T5 -> packed-latent MMDiT, flow matching -> VAE).

Three declarations (``FluxAdapter.load`` also picks Kontext by the folder's
pipeline class, through ``DiffusersAdapter.variants``, for callers that load an adapter directly):

- ``flux``: FLUX.1-dev style folders (``FluxPipeline`` with a guidance embedding);
- ``flux_schnell``: FLUX.1-schnell style folders (no guidance embedding, few steps);
- ``flux_kontext``: FLUX.1-Kontext (``FluxKontextPipeline``): edits with one input image
  (``/v1/images/edits``), or text-to-image without one.

Default parameters are each checkpoint's published usage (diffusers' ``__call__``
defaults for dev; 4 steps and T5 length 256 for schnell; guidance 2.5 for Kontext).
"""

from __future__ import annotations

import json

from omnistage.models.flux.adapter import FluxAdapter, FluxKontextAdapter
from omnistage.models.flux.tiny import build, build_kontext, build_lora, build_schnell
from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.pipeline import ModelFolder


def _guidance_embeds(folder: ModelFolder) -> bool | None:
    try:
        return bool(json.loads((folder.path / "transformer" / "config.json").read_text()).get("guidance_embeds"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


PIPELINE = diffusers_pipeline(
    __file__,
    "flux",
    "FLUX.1-dev: CLIP-L + T5 -> FluxTransformer2DModel (guidance embedding, flow matching) -> VAE",
    classes="FluxPipeline",
    when=lambda f: _guidance_embeds(f) is not False,
    adapter=FluxAdapter,
    output="image",
    defaults={"num_inference_steps": 28, "guidance_scale": 3.5},
)

SCHNELL = diffusers_pipeline(
    __file__,
    "flux_schnell",
    "FLUX.1-schnell: CLIP-L + T5 -> FluxTransformer2DModel (timestep-distilled, few steps) -> VAE",
    classes="FluxPipeline",
    when=lambda f: _guidance_embeds(f) is False,
    adapter=FluxAdapter,
    output="image",
    defaults={"num_inference_steps": 4, "guidance_scale": 0.0, "max_sequence_length": 256},
)

KONTEXT = diffusers_pipeline(
    __file__,
    "flux_kontext",
    "FLUX.1-Kontext: image edit; the input image's latents join the FLUX transformer's sequence",
    classes="FluxKontextPipeline",
    adapter=FluxKontextAdapter,
    output="image",
    defaults={"num_inference_steps": 28, "guidance_scale": 2.5},
    # max_area: output pixels (the requested size gives the aspect ratio); auto_resize: resize the input image
    # to the nearest Kontext training resolution (diffusers' default) instead of keeping its own size
    extra_body_params={"max_area": int, "auto_resize": bool},
)

PIPELINES = [PIPELINE, SCHNELL, KONTEXT]
TINY = {"flux": build, "flux_schnell": build_schnell, "flux_kontext": build_kontext, "flux_lora": build_lora}

__all__ = ["KONTEXT", "PIPELINE", "PIPELINES", "SCHNELL", "TINY", "FluxAdapter", "FluxKontextAdapter"]
