"""Tiny Stable Diffusion 3 folder: real classes (MMDiT, CLIP-L/G, T5, VAE), random weights."""

from __future__ import annotations

from pathlib import Path

from omnistage.stages.diffusion import tiny_parts as parts


def transformer(*, layers: int = 1, heads: int = 4, head_dim: int = 8, sample_size: int = 32, patch_size: int = 2):
    """The tiny MMDiT (random weights: seed it first)."""
    from diffusers import SD3Transformer2DModel

    inner = heads * head_dim
    return SD3Transformer2DModel(
        sample_size=sample_size,
        patch_size=patch_size,
        in_channels=4,
        num_layers=layers,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        caption_projection_dim=inner,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
    )


def build(
    outdir: Path,
    *,
    layers: int = 1,
    heads: int = 4,
    head_dim: int = 8,
    sample_size: int = 32,
    patch_size: int = 2,
    vae_channels: tuple[int, ...] = (4, 4),
) -> None:
    """Write a loadable SD3 diffusers folder (VAE factor 2 x patch 2: sizes are multiples of 4).

    The benchmark passes a bigger config."""
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    torch.manual_seed(0)
    mmdit = transformer(layers=layers, heads=heads, head_dim=head_dim, sample_size=sample_size, patch_size=patch_size)
    vae = AutoencoderKL(
        block_out_channels=vae_channels,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * len(vae_channels),
        up_block_types=("UpDecoderBlock2D",) * len(vae_channels),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=1,
        sample_size=sample_size,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )
    clip_tok = parts.clip_tokenizer()
    pipe = StableDiffusion3Pipeline(
        transformer=mmdit.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae.eval(),
        text_encoder=parts.clip_text_model(with_projection=True),
        tokenizer=clip_tok,
        text_encoder_2=parts.clip_text_model(with_projection=True),
        tokenizer_2=clip_tok,
        text_encoder_3=parts.t5_encoder(),
        tokenizer_3=parts.t5_tokenizer(),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


# the attention projections of the MMDiT's joint blocks (image and text streams)
LORA_TARGETS = r"transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"


def build_lora(
    outdir: Path, *, seed: int = 0, rank: int = 4, alpha: float = 8.0, targets: str = LORA_TARGETS, **model: int
) -> None:
    """A LoRA for the model ``build`` writes (``model``: the same size arguments): random non-zero A and B of
    ``rank`` on the attention projections, saved by diffusers with its LoRA metadata (``lora_alpha``, so
    the layers scale by alpha / rank)."""
    from diffusers import StableDiffusion3Pipeline

    from omnistage.stages.diffusion.tiny_lora import random_lora, save

    layers = random_lora(transformer(**model), targets, rank, seed)
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in layers})
    save(StableDiffusion3Pipeline, Path(outdir), layers, {"r": rank, "lora_alpha": alpha, "target_modules": modules})
