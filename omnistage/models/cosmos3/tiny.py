"""Tiny Cosmos3 folder: the real classes of ``Cosmos3OmniPipeline`` (the joint MoT transformer with its sound and
action heads, the Wan VAE, the AVAE sound tokenizer, UniPC), toy sizes, seeded random weights, a locally trained
tokenizer with Qwen's chat and vision tokens."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.models.shared.tiny.chat import train_tokenizer
from omnistage.models.shared.tiny.qwen_vl import SPECIAL_TOKENS

ACTION_DIM = 32  # the padded action width of the tiny transformer (each domain's own width is diffusers' table)


def tokenizer():
    tok = train_tokenizer(extra_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|endoftext|>",)])
    tok.eos_token = "<|im_end|>"  # the pipeline appends eos then <|vision_start|> to every prompt
    return tok


def transformer(vocab_size: int):
    from diffusers import Cosmos3OmniTransformer

    torch.manual_seed(0)
    model = Cosmos3OmniTransformer(
        head_dim=8,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        latent_channel=4,
        latent_patch_size=2,
        patch_latent_dim=16,
        rope_axes_dim=(2, 1, 1),
        vocab_size=vocab_size,
        sound_gen=True,
        sound_dim=8,
        action_gen=True,
        action_dim=ACTION_DIM,
    )
    with torch.no_grad():  # zero-initialised heads and embeddings would hide wiring bugs: every weight random
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


def vae():
    from diffusers import AutoencoderKLWan

    torch.manual_seed(1)
    return AutoencoderKLWan(
        base_dim=3,
        z_dim=4,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
        scale_factor_spatial=8,
        scale_factor_temporal=4,
    ).eval()


def sound_tokenizer():
    from diffusers import Cosmos3AVAEAudioTokenizer

    torch.manual_seed(2)
    return Cosmos3AVAEAudioTokenizer(
        sampling_rate=16000,
        vocoder_input_dim=8,
        dec_dim=8,
        dec_c_mults=(1, 2),
        dec_strides=(4, 4),
        enc_dim=8,
        enc_intermediate_dim=16,
        enc_num_layers=1,
        enc_num_blocks=1,
        enc_latent_dim=8,
        enc_c_mults=(1, 2),
        enc_strides=(4, 4),
    ).eval()


def pipeline():
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler

    tok = tokenizer()
    return Cosmos3OmniPipeline(
        transformer=transformer(len(tok)),
        text_tokenizer=tok,
        vae=vae(),
        scheduler=UniPCMultistepScheduler(),
        sound_tokenizer=sound_tokenizer(),
        enable_safety_checker=False,  # the guardrail package is not installed (and has no tiny form)
    )


def build(outdir: Path) -> None:
    pipeline().save_pretrained(outdir, safe_serialization=True)
