"""Tiny SD 1.5 and SDXL folders: real classes (UNet, CLIP text encoders, VAE), random weights.

SD 1.5 ships PNDM like the real checkpoint (multistep: per-request scheduler
state); SDXL ships Euler like the real checkpoint (vectorised sampler).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.stages.diffusion import tiny_parts as parts

_UNET = dict(
    block_out_channels=(4, 8),
    layers_per_block=1,
    sample_size=32,
    in_channels=4,
    out_channels=4,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
    norm_num_groups=2,
)


def _vae():
    from omnistage.models.shared.tiny import autoencoder_kl

    return autoencoder_kl.vae(stages=2, sample_size=64)


def build_sd15(outdir: Path) -> None:
    import torch
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(cross_attention_dim=32, attention_head_dim=2, **_UNET).eval()
    scheduler = PNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        skip_prk_steps=True,
        steps_offset=1,
        set_alpha_to_one=False,
    )
    pipe = StableDiffusionPipeline(
        vae=_vae(),
        text_encoder=parts.clip_text_model(with_projection=False),
        tokenizer=parts.clip_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


def build_sdxl(outdir: Path) -> None:
    import torch
    from diffusers import (
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        cross_attention_dim=64,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=80,
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        transformer_layers_per_block=(1, 2),
        **_UNET,
    ).eval()
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1, timestep_spacing="leading"
    )
    tok = parts.clip_tokenizer()
    pipe = StableDiffusionXLPipeline(
        vae=_vae(),
        text_encoder=parts.clip_text_model(with_projection=False),
        text_encoder_2=parts.clip_text_model(with_projection=True),
        tokenizer=tok,
        tokenizer_2=tok,
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
