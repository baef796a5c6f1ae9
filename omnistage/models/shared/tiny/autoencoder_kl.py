"""diffusers' ``AutoencoderKL`` at toy size (Stable Diffusion's, PixArt-Σ's, FLUX.1's, GLM-Image's, LongCat-Image's
VAE layout): each family passes its depth, latent channels and the release's factors."""

from __future__ import annotations


def vae(*, stages: int = 4, latent_channels: int = 4, sample_size: int = 32, **extra):
    """Four-channel blocks, one layer each: spatial factor 2**(stages-1). ``extra``: the release's scaling and
    shift factors, latent statistics, quant convolutions."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        block_out_channels=(4,) * stages,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * stages,
        up_block_types=("UpDecoderBlock2D",) * stages,
        latent_channels=latent_channels,
        layers_per_block=1,
        norm_num_groups=1,
        sample_size=sample_size,
        **extra,
    ).eval()
