"""Tiny Z-Image folder: real classes (ZImageTransformer2DModel, Qwen3 text encoder, AutoencoderKL), random weights."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.qwen3 import text_encoder, tokenizer


def transformer(
    *,
    layers: int = 1,
    refiner_layers: int = 1,
    heads: int = 2,
    head_dim: int = 16,
    latent_channels: int = 4,
    cap_dim: int = 32,
):
    from diffusers import ZImageTransformer2DModel

    # RoPE axes (frame, row, column) split the head dim as Z-Image's (32, 48, 48) does
    third = (head_dim - head_dim // 4) // 2
    axes = [head_dim - 2 * third, third, third]
    return ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=latent_channels,
        dim=heads * head_dim,
        n_layers=layers,
        n_refiner_layers=refiner_layers,
        n_heads=heads,
        n_kv_heads=heads,
        cap_feat_dim=cap_dim,
        axes_dims=axes,
        axes_lens=[256, 64, 64],
    ).eval()


def build(outdir: Path) -> None:
    """Write a loadable ZImagePipeline folder (Z-Image-Turbo layout: fixed shift 3; sizes are multiples of 16)."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    from omnistage.models.shared.tiny.flux import vae

    torch.manual_seed(0)
    tok = tokenizer()
    pipe = ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False),
        vae=vae(),
        text_encoder=text_encoder(len(tok)),
        tokenizer=tok,
        transformer=transformer(),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
