"""Tiny Wan text-to-video folder: real classes (WanTransformer3DModel, UMT5, AutoencoderKLWan), random weights."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.wan import components, scheduler, umt5_encoder, vae
from omnistage.stages.diffusion import tiny_parts as parts


def transformer(
    layers: int = 2, heads: int = 2, head_dim: int = 12, in_channels: int = 16, image_dim: int | None = None
):
    from diffusers import WanTransformer3DModel

    # image_dim: the CLIP vision width of Wan2.1 I2V, whose image tokens get their own K/V projections
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=in_channels,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
        image_dim=image_dim,
        added_kv_proj_dim=None if image_dim is None else heads * head_dim,
    ).eval()


def build(outdir: Path, *, boundary_ratio: float | None = None) -> None:
    """Write a loadable WanPipeline folder (sizes are multiples of 16, frame counts 4k+1).

    ``boundary_ratio`` adds a second (low-noise) transformer, the Wan2.2 A14B layout."""
    import torch
    from diffusers import WanPipeline

    torch.manual_seed(0)
    kwargs = {}
    if boundary_ratio is not None:
        kwargs = {"transformer_2": transformer(), "boundary_ratio": boundary_ratio}
    pipe = WanPipeline(**components(transformer), **kwargs)
    pipe.save_pretrained(outdir, safe_serialization=True)


def build_wan22(outdir: Path) -> None:
    """Wan2.2 A14B layout: high-noise ``transformer`` + low-noise ``transformer_2`` switched at a boundary."""
    build(outdir, boundary_ratio=0.875)


def build_i2v(outdir: Path) -> None:
    """Wan2.1 I2V layout: CLIP vision tokens + first-frame latents (4 mask + 16 channels) condition the DiT."""
    import torch
    from diffusers import WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(0)
    clip = CLIPVisionModel(
        CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            image_size=32,
            patch_size=8,
        )
    ).eval()
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    pipe = WanImageToVideoPipeline(
        tokenizer=parts.t5_tokenizer(),
        text_encoder=umt5_encoder(),
        vae=vae(),
        scheduler=scheduler(),
        image_processor=processor,
        image_encoder=clip,
        transformer=transformer(in_channels=36, image_dim=32),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
