"""PixArt-Σ family: one diffusion stage (T5 -> PixArtTransformer2DModel, DPM-Solver++ -> VAE).

Defaults are ``PixArtSigmaPipeline.__call__``'s: 20 steps, guidance 4.5 (CFG
when > 1, "" as the negative prompt), T5 length 300, and resolution binning
on: the requested size is served from the nearest trained aspect-ratio bin and
resized back (``use_resolution_binning: false`` in ``extra_body`` generates at
the requested size, a multiple of 16).
"""

from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.pixart_sigma.tiny import build
from omnistage.models.shared.pixart_adapter import PixArtSigmaAdapter
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

DEFAULT_PARAMS = {"num_inference_steps": 20, "guidance_scale": 4.5}  # PixArtSigmaPipeline.__call__'s

PIPELINE = Pipeline(
    name="pixart_sigma",
    description="PixArt-Σ: T5 -> PixArtTransformer2DModel (CFG, DPM-Solver++) -> VAE",
    matches=lambda f: f.diffusers_class == "PixArtSigmaPipeline",
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=PixArtSigmaAdapter,
            output="image",
            can_output="image,latent",
            final=True,
            default_params=dict(DEFAULT_PARAMS),
        )
    ],
    # use_resolution_binning: serve from the nearest trained aspect-ratio bin, resized back (default true)
    extra_body_params={"use_resolution_binning": bool},
    info=PipelineInfo(image_edits=False),  # text-to-image only: every input image is refused
    deploy_file=DEPLOY,
)
PIPELINES = [PIPELINE]
TINY = {"pixart_sigma": build}

__all__ = ["PIPELINE", "PIPELINES", "TINY", "PixArtSigmaAdapter"]
