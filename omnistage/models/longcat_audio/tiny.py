"""Tiny LongCat-AudioDiT folder: real classes (LongCatAudioDiTTransformer, UMT5 encoder, LongCatAudioDiTVae,
FlowMatchEulerDiscreteScheduler), random weights.

Sizes: a 16 kHz mono VAE with strides 4 x 8 x 8 (hop 256, 62.5 latent frames a second; 16 kHz: a rate every
response format, MP3's included, can carry) and a two-block DiT. The latent length is the clip's duration, so a
0.5 s request denoises 31 frames. The model's own hop is 2048 at 24 kHz; the pipeline reads both from the
VAE's config. No scheduler is written: the pipeline builds its own (flow-match Euler, shift 1, inverted
sigmas), and diffusers' ``save_pretrained`` skips a component whose argument defaults to None.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.wan import umt5_encoder
from omnistage.stages.diffusion import tiny_parts as parts

SAMPLE_RATE = 16000
HOP = 256  # the VAE's strides' product: audio samples per latent frame
LATENT_DIM = 4
TEXT_DIM = 32
TOKENS = 32  # the tokenizer's model_max_length: longer prompts are truncated to it


def transformer():
    from diffusers import LongCatAudioDiTTransformer

    return LongCatAudioDiTTransformer(
        dit_dim=32, dit_depth=2, dit_heads=2, dit_text_dim=TEXT_DIM, latent_dim=LATENT_DIM
    ).eval()


def vae():
    from diffusers import LongCatAudioDiTVae

    return LongCatAudioDiTVae(
        in_channels=1,
        channels=4,
        c_mults=[1, 2, 2],
        strides=[4, 8, 8],
        latent_dim=LATENT_DIM,
        encoder_latent_dim=2 * LATENT_DIM,
        downsampling_ratio=HOP,
        sample_rate=SAMPLE_RATE,
    ).eval()


def build(outdir: Path) -> None:
    """Write a loadable LongCatAudioDiTPipeline folder."""
    import torch
    from diffusers import LongCatAudioDiTPipeline

    torch.manual_seed(0)
    tok = parts.t5_tokenizer()
    tok.model_max_length = TOKENS
    dit = transformer()
    # the model zero-initialises its output projections and modulation (and GRN's gamma/beta): random weights
    # there too, or every prediction would be 0 and any two pipelines trivially equal
    with torch.no_grad():
        for p in dit.parameters():
            if not p.any():
                p.normal_(0.0, 0.2)
    autoencoder = vae()
    with torch.no_grad():  # a quieter output convolution: random weights make clips of amplitude ~4, mostly
        autoencoder.decoder.layers[-2].weight_g.mul_(0.25)  # clipped in 16-bit answers; ~1 compares the samples
    pipe = LongCatAudioDiTPipeline(
        vae=autoencoder,
        text_encoder=umt5_encoder(d_model=TEXT_DIM, vocab_size=len(tok)),
        tokenizer=tok,
        transformer=dit,
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
