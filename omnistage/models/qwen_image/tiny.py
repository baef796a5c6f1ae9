"""Tiny Qwen-Image folders: diffusers' QwenImage / QwenImageEdit / QwenImageEditPlus layouts, random weights.

    python -m omnistage.testing.tiny qwen_image DIR            # text-to-image (Qwen-Image, -2512)
    python -m omnistage.testing.tiny qwen_image_edit DIR       # one input image (Qwen-Image-Edit)
    python -m omnistage.testing.tiny qwen_image_edit_plus DIR  # 1-3 input images (-2509 / -2511 style)

Real classes at toy sizes: ``QwenImageTransformer2DModel``, a Qwen2.5-VL text
encoder (with its vision tower, which the edit pipelines feed their input
images through), ``AutoencoderKLQwenImage``, the released scheduler config, a
byte-level BPE ``Qwen2Tokenizer`` trained locally with Qwen's special tokens
(on the prompt templates too, so that they tokenize to the 34 / 64 tokens the
pipelines drop, as with Qwen's own tokenizer), and for edits transformers'
``Qwen2VLProcessor`` (image and video processors + that tokenizer).

Sizes: the text-to-image VAE is x8 as the real one (sizes are multiples of
16). The edit pipelines resize every input image to about 1024x1024 pixels
for the VAE whatever the request's size, so the edit VAE is x16 with no
residual blocks: encoding one input image stays around a second on one CPU
core and each image adds 32x32 tokens (sizes are multiples of 32). The image
processor caps input images at 16 vision tokens.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.qwen_image import SCHEDULER, tokenizer, transformer, vae
from omnistage.models.shared.tiny.qwen_vl import processor, text_encoder


def build(outdir: Path, *, seed: int = 0, layers: int = 2, heads: int = 2) -> None:
    """Text-to-image (QwenImagePipeline). A benchmark may ask for a bigger transformer (``layers``, ``heads``
    of width 16)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    tok = tokenizer()
    pipe = QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae(stages=4, res_blocks=1),
        text_encoder=text_encoder(tok, seed),
        tokenizer=tok,
        transformer=transformer(layers=layers, heads=heads, seed=seed),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


def _build_edit(outdir: Path, class_name: str, *, zero_cond_t: bool, seed: int, layers: int, heads: int) -> None:
    import diffusers

    tok = tokenizer()
    pipe = getattr(diffusers, class_name)(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae(stages=5, res_blocks=0),
        text_encoder=text_encoder(tok, seed),
        tokenizer=tok,
        processor=processor(tok),
        transformer=transformer(zero_cond_t=zero_cond_t, layers=layers, heads=heads, seed=seed),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


def build_edit(outdir: Path, *, seed: int = 0, layers: int = 2, heads: int = 2) -> None:
    """One input image (QwenImageEditPipeline, as Qwen-Image-Edit)."""
    _build_edit(outdir, "QwenImageEditPipeline", zero_cond_t=False, seed=seed, layers=layers, heads=heads)


def build_edit_plus(outdir: Path, *, seed: int = 0, layers: int = 2, heads: int = 2) -> None:
    """1-3 input images (QwenImageEditPlusPipeline) with -2511's zero_cond_t (input-image tokens get t=0)."""
    _build_edit(outdir, "QwenImageEditPlusPipeline", zero_cond_t=True, seed=seed, layers=layers, heads=heads)
