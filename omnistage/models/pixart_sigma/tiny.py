"""Tiny PixArt-Σ folder: real classes (PixArtTransformer2DModel, T5, AutoencoderKL, DPM-Solver++), random weights."""

from __future__ import annotations

from pathlib import Path

from omnistage.stages.diffusion import tiny_parts as parts


def transformer(*, sample_size: int = 32, layers: int = 1, heads: int = 2, head_dim: int = 8, caption_dim: int = 32):
    from diffusers import PixArtTransformer2DModel

    # learned variance (out_channels = 2 x in_channels) as the released checkpoints; sample size 32 selects
    # diffusers' 256-pixel resolution bins
    return PixArtTransformer2DModel(
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=4,
        out_channels=8,
        num_layers=layers,
        cross_attention_dim=heads * head_dim,
        sample_size=sample_size,
        patch_size=2,
        caption_channels=caption_dim,
        norm_num_groups=1,
    ).eval()


def vae():
    from omnistage.models.shared.tiny import autoencoder_kl

    # spatial factor 8 (four blocks) and the SDXL VAE's scaling factor, as PixArt-Σ ships
    return autoencoder_kl.vae(scaling_factor=0.13025)


def build(outdir: Path) -> None:
    """Write a loadable PixArtSigmaPipeline folder (sizes are multiples of 16: VAE 8 x patch 2)."""
    import torch
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline

    torch.manual_seed(0)
    pipe = PixArtSigmaPipeline(
        tokenizer=parts.t5_tokenizer(),
        text_encoder=parts.t5_encoder(),
        vae=vae(),
        transformer=transformer(),
        scheduler=DPMSolverMultistepScheduler(),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
