"""Tiny Stable Audio 3 folder: real classes (T5GemmaEncoderModel, StableAudio3DurationEmbedder,
StableAudio3DiTModel, AutoencoderSAME, FlowMatchEulerDiscreteScheduler), random weights, a locally trained Gemma
tokenizer.

Sizes: a 16 kHz stereo SAME VAE with patches of 64 samples and one resampling block of stride 4 (hop 256, 62.5
latent frames a second; the release's is 4096 at 44.1 kHz), a two-block DiT with 8 memory tokens, prompts padded
to 32 tokens (the release's 256). The scheduler samples ping-pong (``stochastic_sampling=True``), as the distilled
checkpoint's does (``stable_audio3_base``: the same weights with the base checkpoint's Euler scheduler); ``num_train_timesteps=1`` as the release's, so the DiT reads the timestep as the sigma in
[0, 1].
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.sizes import decoder
from omnistage.stages.diffusion import tiny_parts as parts

SAMPLE_RATE = 16000
HOP = 256  # the VAE's patch size x strides: audio samples per latent frame
LATENT_DIM = 8
TEXT_DIM = 32  # the T5Gemma encoder's width: the DiT's cross-attention tokens and the duration embedding
TOKENS = 32  # the tokenizer's model_max_length: every prompt is padded (or truncated) to it
MAX_SECONDS = 12.0  # the duration embedder's max_val (the release's 384 s): above the pipeline's default 10 s


def gemma_tokenizer():
    from transformers import GemmaTokenizerFast

    tok = GemmaTokenizerFast().train_new_from_iterator(parts._CORPUS * 4, vocab_size=300)
    tok.model_max_length = TOKENS
    return tok


def text_encoder(vocab_size: int):
    from transformers import T5GemmaConfig, T5GemmaEncoderModel, T5GemmaModuleConfig

    module = dict(**decoder(vocab_size, TEXT_DIM, head_dim=16, max_positions=256), query_pre_attn_scalar=16,
                  sliding_window=64)  # fmt: skip
    config = T5GemmaConfig(
        encoder=T5GemmaModuleConfig(**module),
        decoder=T5GemmaModuleConfig(**module),
        vocab_size=vocab_size,
        is_encoder_decoder=False,  # T5GemmaEncoderModel refuses an encoder-decoder config
    )
    return T5GemmaEncoderModel(config).eval()


def build(outdir: Path, *, ping_pong: bool = True) -> None:
    """Write a loadable StableAudio3Pipeline folder (``ping_pong=False``: the base checkpoint's Euler scheduler)."""
    import torch
    from diffusers import (
        AutoencoderSAME,
        FlowMatchEulerDiscreteScheduler,
        StableAudio3DiTModel,
        StableAudio3DurationEmbedder,
        StableAudio3Pipeline,
    )

    torch.manual_seed(0)
    tok = gemma_tokenizer()
    dit = StableAudio3DiTModel(
        io_channels=LATENT_DIM,
        embed_dim=32,
        depth=2,
        num_heads=2,
        cond_token_dim=TEXT_DIM,
        global_cond_dim=TEXT_DIM,
        local_add_cond_dim=LATENT_DIM + 1,
        timestep_features_dim=16,
        num_memory_tokens=8,
    ).eval()
    vae = AutoencoderSAME(
        audio_channels=2,
        patch_size=64,
        encoder_channels=16,
        encoder_c_mults=[2],
        encoder_strides=[4],
        encoder_transformer_depths=[1],
        latent_dim=LATENT_DIM,
        dim_heads=16,
        ff_mult=2,
        sampling_rate=SAMPLE_RATE,
    ).eval()
    # the DiT zero-initialises its pre/post convolutions and the padding embedding, the VAE its feed-forward
    # outputs: random weights there too, or those paths would be identities and untested
    with torch.no_grad():
        for module in (dit, vae):
            for p in module.parameters():
                if not p.any():
                    p.normal_(0.0, 0.2)
    pipe = StableAudio3Pipeline(
        vae=vae,
        text_encoder=text_encoder(len(tok)),
        tokenizer=tok,
        duration_embedder=StableAudio3DurationEmbedder(output_dim=TEXT_DIM, fourier_dim=16, max_val=MAX_SECONDS),
        transformer=dit,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1, shift=1.0, stochastic_sampling=ping_pong),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


def build_base(outdir: Path) -> None:
    """The same folder with the base checkpoint's deterministic Euler scheduler (``stochastic_sampling=False``)."""
    build(outdir, ping_pong=False)
