"""FLUX.2 family: one diffusion stage (text encoder -> Flux2Transformer2DModel, flow matching -> VAE).

- ``flux2``: FLUX.2 [dev] (``Flux2Pipeline``, a Mistral3 text encoder): guidance-distilled, ``guidance_scale``
  is the guidance embedding (no CFG, no negative prompt); text-to-image and reference-image edits as [klein].
- ``flux2_klein``: FLUX.2 [klein] (``Flux2KleinPipeline``, a Qwen3 text encoder): text-to-image, and edits
  with one or more reference images (``/v1/images/edits``; the output size defaults to the first one's).
  CFG when ``guidance_scale`` > 1 on the base checkpoints; the distilled ones (``is_distilled``) never run it.

Defaults are ``__call__``'s: 50 steps, guidance 4.0, text length 512 (the distilled checkpoints' model cards
use 4 steps and guidance 1: send them).
"""

from pathlib import Path

from omnistage.models.flux2.adapter import Flux2Adapter, Flux2KleinAdapter
from omnistage.models.flux2.tiny import build_dev, build_klein, build_lora
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

KLEIN = Pipeline(
    name="flux2_klein",
    description="FLUX.2 [klein]: Qwen3 -> Flux2Transformer2DModel (CFG unless distilled; reference-image edits) -> VAE",
    matches=lambda f: f.diffusers_class == "Flux2KleinPipeline",
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=Flux2KleinAdapter,
            output="image",
            can_output="image,latent",
            final=True,
            default_params={"num_inference_steps": 50, "guidance_scale": 4.0},
        )
    ],
    deploy_file=DEPLOY,
)
DEV = Pipeline(
    name="flux2",
    description="FLUX.2 [dev]: Mistral3 -> Flux2Transformer2DModel (distilled guidance embedding; reference-image "
    "edits) -> VAE",
    matches=lambda f: f.diffusers_class == "Flux2Pipeline",
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=Flux2Adapter,
            output="image",
            can_output="image,latent",
            final=True,
            default_params={"num_inference_steps": 50, "guidance_scale": 4.0},
        )
    ],
    deploy_file=DEPLOY,
)
PIPELINES = [DEV, KLEIN]
TINY = {"flux2": build_dev, "flux2_klein": build_klein, "flux2_lora": build_lora}

__all__ = ["DEV", "KLEIN", "PIPELINES", "TINY", "Flux2Adapter", "Flux2KleinAdapter"]
