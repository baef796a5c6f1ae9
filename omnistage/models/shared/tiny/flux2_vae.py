"""FLUX.2's VAE (``AutoencoderKLFlux2``, with its batch-norm latent statistics) at toy size: FLUX.2's and
ERNIE-Image's latent space."""

from __future__ import annotations


def vae(latent_channels: int = 4):
    import torch
    from diffusers import AutoencoderKLFlux2

    model = AutoencoderKLFlux2(
        block_out_channels=(4, 4, 4, 4),
        latent_channels=latent_channels,
        layers_per_block=1,
        norm_num_groups=1,
        sample_size=32,
    ).eval()
    # non-trivial batch-norm statistics (fresh ones are 0 and 1), so (de)normalisation is exercised
    g = torch.Generator().manual_seed(1)
    model.bn.running_mean.copy_(torch.randn(model.bn.running_mean.shape, generator=g) * 0.1)
    model.bn.running_var.copy_(torch.rand(model.bn.running_var.shape, generator=g) + 0.5)
    return model
