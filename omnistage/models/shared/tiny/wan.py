"""Wan's UMT5 text encoder, video VAE and scheduler at toy size (Helios uses the first two, Wan VACE all three), and
the toy 3-D DiT sizes the Wan-derived transformers share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omnistage.stages.diffusion import tiny_parts as parts

# WanTransformer3DModel's toy sizes, which Helios' and Wan VACE's transformers take too (each adds its own keys)
DIT = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=16,
    out_channels=16,
    text_dim=32,
    freq_dim=256,
    ffn_dim=32,
    num_layers=2,
)


def umt5_encoder(d_model: int = 32, vocab_size: int = 1000):
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(
        d_model=d_model,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        vocab_size=vocab_size,
    )
    return UMT5EncoderModel(cfg).eval()


def vae():
    from diffusers import AutoencoderKLWan

    # spatial factor 8 (three downsamples), temporal factor 4 (two of them temporal)
    return AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).eval()


def scheduler(flow_shift: float = 3.0):
    from diffusers import UniPCMultistepScheduler

    # what the Wan2.1 T2V checkpoints ship: UniPC on flow sigmas
    return UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=flow_shift, num_train_timesteps=1000
    )


def components(transformer: Callable[[], Any]) -> dict[str, Any]:
    """A Wan-family text-to-video pipeline's components over these parts and ``transformer()``, built in this order
    (the seeded fixtures' weights depend on it): the T5 tokenizer, UMT5, the VAE, the scheduler, the transformer."""
    return dict(
        tokenizer=parts.t5_tokenizer(),
        text_encoder=umt5_encoder(),
        vae=vae(),
        scheduler=scheduler(),
        transformer=transformer(),
    )
