"""Tiny FLUX.1 folders: real classes (FluxTransformer2DModel, CLIP-L, T5, AutoencoderKL), random weights."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.flux import DEV_SCHEDULER, vae
from omnistage.stages.diffusion import tiny_parts as parts

_SCHNELL_SCHEDULER = dict(shift=1.0, use_dynamic_shifting=False)


def transformer(
    *,
    guidance_embeds: bool,
    layers: int = 1,
    single_layers: int = 1,
    heads: int = 2,
    head_dim: int = 16,
    latent_channels: int = 4,
):
    from diffusers import FluxTransformer2DModel

    # RoPE axes split the head dim as FLUX's (16, 56, 56) does: one small axis, two equal ones
    third = (head_dim - head_dim // 4) // 2
    axes = (head_dim - 2 * third, third, third)
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=latent_channels * 4,
        num_layers=layers,
        num_single_layers=single_layers,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=guidance_embeds,
        axes_dims_rope=axes,
    ).eval()


def _components(guidance_embeds: bool, schnell: bool = False) -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return dict(
        scheduler=FlowMatchEulerDiscreteScheduler(**(_SCHNELL_SCHEDULER if schnell else DEV_SCHEDULER)),
        vae=vae(),
        text_encoder=parts.clip_text_model(with_projection=False),
        tokenizer=parts.clip_tokenizer(),
        text_encoder_2=parts.t5_encoder(),
        tokenizer_2=parts.t5_tokenizer(),
        transformer=transformer(guidance_embeds=guidance_embeds),
    )


def build(outdir: Path) -> None:
    """FLUX.1-dev layout: guidance embedding, dynamic shift (sizes are multiples of 16)."""
    import torch
    from diffusers import FluxPipeline

    torch.manual_seed(0)
    FluxPipeline(**_components(True)).save_pretrained(outdir, safe_serialization=True)


def build_schnell(outdir: Path) -> None:
    """FLUX.1-schnell layout: no guidance embedding, fixed shift 1."""
    import torch
    from diffusers import FluxPipeline

    torch.manual_seed(0)
    FluxPipeline(**_components(False, schnell=True)).save_pretrained(outdir, safe_serialization=True)


def build_kontext(outdir: Path) -> None:
    """FLUX.1-Kontext-dev layout: FLUX.1-dev's components under FluxKontextPipeline (the input image's
    latents join the sequence)."""
    import torch
    from diffusers import FluxKontextPipeline

    torch.manual_seed(0)
    FluxKontextPipeline(**_components(True)).save_pretrained(outdir, safe_serialization=True)


# attention projections of the double-stream blocks, attention and MLP projections of the single-stream ones
LORA_TARGETS = (
    r"transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"
    r"|single_transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v)|proj_mlp|proj_out)"
)


def build_lora(
    outdir: Path,
    *,
    seed: int = 0,
    rank: int = 4,
    single_rank: int = 2,
    alpha: float = 3.0,
    guidance_embeds: bool = True,
) -> None:
    """A LoRA for the model ``build`` writes (``build_schnell``'s with ``guidance_embeds=False``): random
    non-zero A and B, rank ``rank`` in the double-stream blocks and ``single_rank`` in the single-stream
    ones, with a kohya-style network alpha per layer (no metadata: diffusers derives the scaling from
    the alphas and the per-layer ranks)."""
    from diffusers import FluxPipeline

    from omnistage.stages.diffusion.tiny_lora import random_lora, save

    def ranks(name: str) -> int:
        return single_rank if name.startswith("single_") else rank

    save(
        FluxPipeline,
        Path(outdir),
        random_lora(transformer(guidance_embeds=guidance_embeds), LORA_TARGETS, ranks, seed, alpha=alpha),
    )
