"""Tiny Ovis-Image folder: real classes (OvisImageTransformer2DModel, Qwen3Model, AutoencoderKL, flow-matching
Euler), random weights, a byte-level BPE tokenizer trained locally with Qwen3's chat template."""

from __future__ import annotations

from pathlib import Path

from omnistage.stages.diffusion import tiny_parts as parts

# the pipeline's captioning instruction, in the corpus so that the chat-templated prompt stays short (32 tokens
# before the user's text; the pipeline drops the first 28, as many as Qwen3's own tokenizer makes of it)
INSTRUCTION = (
    "Describe the image by detailing the color, quantity, text, shape, size, texture, spatial "
    "relationships of the objects and background: "
)
TEXT_DIM = 32


def tokenizer():
    from transformers import Qwen2Tokenizer

    from omnistage.models.shared.tiny.qwen3 import CHAT_TEMPLATE, SPECIAL_TOKENS

    tok = Qwen2Tokenizer().train_new_from_iterator(
        (parts._CORPUS + [INSTRUCTION]) * 8, vocab_size=600, new_special_tokens=SPECIAL_TOKENS
    )
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = CHAT_TEMPLATE  # Qwen3's, with enable_thinking
    return tok


def transformer(*, layers: int = 1, single_layers: int = 1, heads: int = 2, head_dim: int = 16):
    from diffusers import OvisImageTransformer2DModel

    # RoPE axes split the head dim as Ovis-Image's (16, 56, 56) does: one small axis, two equal ones
    third = (head_dim - head_dim // 4) // 2
    return OvisImageTransformer2DModel(
        patch_size=1,
        in_channels=16,
        out_channels=16,
        num_layers=layers,
        num_single_layers=single_layers,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=TEXT_DIM,
        axes_dims_rope=(head_dim - 2 * third, third, third),
    ).eval()


def build(outdir: Path) -> None:
    """An OvisImagePipeline folder: FLUX.1's VAE layout (x8, 4 latent channels here) and dynamic-shift scheduler;
    sizes are multiples of 16."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, OvisImagePipeline

    from omnistage.models.shared.tiny.flux import DEV_SCHEDULER, vae
    from omnistage.models.shared.tiny.qwen3 import text_encoder

    torch.manual_seed(0)
    tok = tokenizer()
    pipe = OvisImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**DEV_SCHEDULER),
        vae=vae(),
        text_encoder=text_encoder(len(tok), TEXT_DIM),
        tokenizer=tok,
        transformer=transformer(),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
