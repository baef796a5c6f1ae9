"""Tiny LongCat-Image folders: real classes (LongCatImageTransformer2DModel, Qwen2.5-VL with its vision tower,
AutoencoderKL with 16 latent channels, flow-matching Euler, Qwen2VLProcessor), random weights, a byte-level
BPE tokenizer trained locally with Qwen's special tokens and the pipelines' templates.

The edit pipeline resizes every input image to about 1024x1024 pixels whatever the request, so the edit
VAE is x16 (as Qwen-Image's tiny edit folders): 32x32 output tokens and as many input-image tokens."""

from __future__ import annotations

import string
from pathlib import Path

# the pipelines' system templates, in the corpus so that they tokenize compactly
_CORPUS = [
    (
        "<|im_start|>system\nAs an image captioning expert, generate a descriptive text prompt based on an image "
        "content, suitable for input to a text-to-image model.<|im_end|>\n<|im_start|>user\n"
    ),
    (
        "<|im_start|>system\nAs an image editing expert, first analyze the content and attributes of the input "
        "image(s). Then, based on the user's editing instructions, clearly and precisely determine how to modify the "
        "given image(s), ensuring that only the specified parts are altered and all other aspects remain consistent "
        "with the original(s).<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
    ),
    "<|im_end|>\n<|im_start|>assistant\n",
    "a photo of a red cat sitting on a blue chair, the sign says 'hello'",
    "make the cat green and add a hat; replace the background with a beach",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]
# Qwen2-VL's chat template for text turns (rewire_prompt renders the rewrite request with it)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}{% if c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SCHEDULER = dict(
    shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096
)


def tokenizer():
    from transformers import Qwen2Tokenizer

    from omnistage.models.shared.tiny.qwen_vl import SPECIAL_TOKENS

    tok = Qwen2Tokenizer().train_new_from_iterator(_CORPUS * 20, vocab_size=800, new_special_tokens=SPECIAL_TOKENS)
    tok.pad_token = "<|endoftext|>"
    return tok


def processor(tok):
    from omnistage.models.shared.tiny.qwen_vl import processor as qwen_processor

    proc = qwen_processor(tok)  # at most 16 vision tokens per image
    proc.chat_template = CHAT_TEMPLATE
    return proc


def transformer(*, text_dim: int, layers: int = 1, single_layers: int = 1, heads: int = 2):
    from diffusers import LongCatImageTransformer2DModel

    # head dim 16 split over RoPE's three axes as LongCat's (16, 56, 56): one small axis, two equal ones
    return LongCatImageTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=layers,
        num_single_layers=single_layers,
        attention_head_dim=16,
        num_attention_heads=heads,
        joint_attention_dim=text_dim,
        pooled_projection_dim=text_dim,
        axes_dims_rope=[4, 6, 6],
    ).eval()


def vae(stages: int):
    from omnistage.models.shared.tiny import flux

    # 16 latent channels (the pipelines hard-code them), FLUX.1's scaling and shift, x2**(stages-1)
    return flux.vae(16, stages)


def _build(outdir: Path, class_name: str, vae_stages: int) -> None:
    import diffusers
    import torch

    from omnistage.models.shared.tiny.qwen_vl import text_encoder

    torch.manual_seed(0)
    tok = tokenizer()
    encoder = text_encoder(tok)
    pipe = getattr(diffusers, class_name)(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae(vae_stages),
        text_encoder=encoder,
        tokenizer=tok,
        text_processor=processor(tok),
        transformer=transformer(text_dim=encoder.config.text_config.hidden_size),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


def build(outdir: Path) -> None:
    """LongCatImagePipeline (text-to-image): an x8 VAE, sizes are multiples of 16."""
    _build(outdir, "LongCatImagePipeline", 4)


def build_edit(outdir: Path) -> None:
    """LongCatImageEditPipeline: an x16 VAE (the ~1024x1024 output stays 32x32 tokens)."""
    _build(outdir, "LongCatImageEditPipeline", 5)
