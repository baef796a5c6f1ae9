"""Tiny Wan VACE folder: real classes (WanVACETransformer3DModel, UMT5, AutoencoderKLWan), random weights."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.wan import DIT, components


def transformer():
    from diffusers import WanVACETransformer3DModel

    # two DiT layers, each fed a VACE hint; the hints' input is 96 channels: the video's inactive and reactive
    # latents (16 + 16) and the mask folded 8x8 into channels (64, the VAE's spatial factor squared)
    return WanVACETransformer3DModel(
        **DIT,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
        vace_layers=[0, 1],
        vace_in_channels=96,
    ).eval()


def build(outdir: Path) -> None:
    """Write a loadable WanVACEPipeline folder (sizes are multiples of 16, frame counts 4k+1)."""
    import torch
    from diffusers import WanVACEPipeline

    torch.manual_seed(0)
    pipe = WanVACEPipeline(**components(transformer))
    pipe.save_pretrained(outdir, safe_serialization=True)
