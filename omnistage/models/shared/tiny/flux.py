"""FLUX.1's VAE layout at toy size and its dev scheduler config, which other flow-matching families reuse."""

from __future__ import annotations

# FLUX.1-dev's scheduler config (dynamic shift on the packed image length); schnell turns the shift off
DEV_SCHEDULER = dict(
    shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096
)


def vae(latent_channels: int = 4, stages: int = 4):
    """Four stages: spatial factor 8 as FLUX's VAE (sizes are multiples of 16 after 2x2 packing); FLUX's
    scaling/shift factors, no quant convs."""
    from omnistage.models.shared.tiny import autoencoder_kl

    return autoencoder_kl.vae(
        stages=stages,
        latent_channels=latent_channels,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.1159,
        scaling_factor=0.3611,
    )
