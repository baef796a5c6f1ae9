"""Tiny ERNIE-Image folder: real classes (ErnieImageTransformer2DModel, a Mistral3Model text encoder, FLUX.2's
AutoencoderKLFlux2, a Ministral3ForCausalLM prompt enhancer), random weights, a locally trained tokenizer."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny import mistral3
from omnistage.models.shared.tiny.flux2_vae import vae

LATENT_CHANNELS = 4  # the VAE's; the transformer takes 2x2 patches of them (ERNIE-Image: 32 -> 128)
TEXT_LAYERS = 3  # the pipeline reads the second-to-last hidden state
PE_NEW_TOKENS = 64  # the enhancer writes up to its tokenizer's model_max_length new tokens (and reads as many)


def transformer(text_dim: int, heads: int = 2, head_dim: int = 16):
    import torch
    from diffusers import ErnieImageTransformer2DModel

    third = (head_dim - head_dim // 4) // 2  # RoPE axes (text position, row, column) as ERNIE's (32, 48, 48)
    model = ErnieImageTransformer2DModel(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_layers=2,
        ffn_hidden_size=2 * heads * head_dim,
        in_channels=LATENT_CHANNELS * 4,
        out_channels=LATENT_CHANNELS * 4,
        text_in_dim=text_dim,
        rope_axes_dim=(head_dim - 2 * third, third, third),
    ).eval()
    # the model zero-initialises its modulation and output projection: random values there too, or every
    # prediction would be 0 and any two pipelines trivially equal
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, 0.2)
    return model


def prompt_enhancer(vocab_size: int, hidden: int = 16):
    from transformers import Ministral3Config, Ministral3ForCausalLM

    text = {k: v for k, v in mistral3.text_config(vocab_size, hidden, 2).items() if k != "model_type"}
    # Ministral 3's YaRN RoPE stretches 16384 positions 16-fold: a context that says so (else transformers warns)
    text["max_position_embeddings"] = 16 * 16384
    cfg = Ministral3Config(**text)
    return Ministral3ForCausalLM(cfg).eval()


def build(outdir: Path) -> None:
    """Write a loadable ErnieImagePipeline folder with its prompt enhancer; sizes are multiples of 16."""
    import torch
    from diffusers import ErnieImagePipeline, FlowMatchEulerDiscreteScheduler

    torch.manual_seed(0)
    tok = mistral3.tokenizer()
    pe_tok = mistral3.tokenizer()  # the enhancer's own tokenizer folder: chat template, a short rewrite budget
    pe_tok.chat_template = mistral3.TEMPLATE
    pe_tok.model_max_length = PE_NEW_TOKENS
    encoder = mistral3.encoder(len(tok), layers=TEXT_LAYERS, model_class="Mistral3Model")
    pipe = ErnieImagePipeline(
        transformer=transformer(encoder.config.text_config.hidden_size),
        vae=vae(LATENT_CHANNELS),
        text_encoder=encoder,
        tokenizer=tok,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        pe=prompt_enhancer(len(pe_tok)),
        pe_tokenizer=pe_tok,
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
