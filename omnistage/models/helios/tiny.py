"""Tiny Helios folders: real classes (HeliosTransformer3DModel, UMT5, AutoencoderKLWan, HeliosScheduler), random
weights. The VAE is the tiny Wan one (x8 spatial, x4 temporal), so a chunk of 9 latent frames is 33 video frames;
sizes are multiples of 16."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny import wan as wan_tiny
from omnistage.stages.diffusion import tiny_parts as parts


def transformer():
    from diffusers import HeliosTransformer3DModel

    # rope_dim splits the head (t, h, w) as the release's (44, 42, 42) splits 128
    return HeliosTransformer3DModel(
        **wan_tiny.DIT,
        rope_dim=(4, 4, 4),
    ).eval()


def components(stages: int = 1, gamma: float = 1 / 3) -> dict:
    import torch
    from diffusers import HeliosScheduler

    torch.manual_seed(0)
    # the released configs: UniPC on flow sigmas; one stage for HeliosPipeline, three for the pyramid
    return dict(
        tokenizer=parts.t5_tokenizer(),
        text_encoder=wan_tiny.umt5_encoder(),
        vae=wan_tiny.vae(),
        scheduler=HeliosScheduler(stages=stages, shift=1.0, gamma=gamma),
        transformer=transformer(),
    )


def build(outdir: Path) -> None:
    """Write a loadable HeliosPipeline folder."""
    from diffusers import HeliosPipeline

    HeliosPipeline(**components()).save_pretrained(outdir, safe_serialization=True)


def build_pyramid(outdir: Path) -> None:
    """Write a loadable HeliosPyramidPipeline folder (three resolution stages per chunk)."""
    from diffusers import HeliosPyramidPipeline

    # gamma 1/4, not the default 1/3: the block-noise covariance (1+g) I - g 11^T of a 2x2 patch has the
    # eigenvalue 1 - 3g, 0 at 1/3, and diffusers' own cholesky of it (+1e-8 I) fails in fp32 on CPU
    HeliosPyramidPipeline(**components(stages=3, gamma=0.25)).save_pretrained(outdir, safe_serialization=True)
