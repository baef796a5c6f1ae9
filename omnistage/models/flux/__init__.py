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
from pathlib import Path

from omnistage.models.flux.adapter import FluxAdapter, FluxKontextAdapter
from omnistage.models.flux.tiny import build, build_kontext, build_lora, build_schnell
from omnistage.pipeline import ModelFolder, Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment


def _guidance_embeds(folder: ModelFolder) -> bool | None:
    try:
        return bool(json.loads((folder.path / "transformer" / "config.json").read_text()).get("guidance_embeds"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def _stage(default_params: dict, adapter: type[FluxAdapter] = FluxAdapter) -> StageSpec:
    return StageSpec(
        0,
        kind="diffusion",
        adapter=adapter,
        output="image",
        can_output="image,latent",
        final=True,
        default_params=default_params,
    )


PIPELINE = Pipeline(
    name="flux",
    description="FLUX.1-dev: CLIP-L + T5 -> FluxTransformer2DModel (guidance embedding, flow matching) -> VAE",
    matches=lambda f: f.diffusers_class == "FluxPipeline" and _guidance_embeds(f) is not False,
    stages=[_stage({"num_inference_steps": 28, "guidance_scale": 3.5})],
    deploy_file=DEPLOY,
)

SCHNELL = Pipeline(
    name="flux_schnell",
    description="FLUX.1-schnell: CLIP-L + T5 -> FluxTransformer2DModel (timestep-distilled, few steps) -> VAE",
    matches=lambda f: f.diffusers_class == "FluxPipeline" and _guidance_embeds(f) is False,
    stages=[_stage({"num_inference_steps": 4, "guidance_scale": 0.0, "max_sequence_length": 256})],
    deploy_file=DEPLOY,
)

KONTEXT = Pipeline(
    name="flux_kontext",
    description="FLUX.1-Kontext: image edit; the input image's latents join the FLUX transformer's sequence",
    matches=lambda f: f.diffusers_class == "FluxKontextPipeline",
    stages=[_stage({"num_inference_steps": 28, "guidance_scale": 2.5}, FluxKontextAdapter)],
    # max_area: output pixels (the requested size gives the aspect ratio); auto_resize: resize the input image
    # to the nearest Kontext training resolution (diffusers' default) instead of keeping its own size
    extra_body_params={"max_area": int, "auto_resize": bool},
    deploy_file=DEPLOY,
)

PIPELINES = [PIPELINE, SCHNELL, KONTEXT]
TINY = {"flux": build, "flux_schnell": build_schnell, "flux_kontext": build_kontext, "flux_lora": build_lora}

__all__ = ["KONTEXT", "PIPELINE", "PIPELINES", "SCHNELL", "TINY", "FluxAdapter", "FluxKontextAdapter"]
