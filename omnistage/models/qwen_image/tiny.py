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

import string
from pathlib import Path

from omnistage.models.shared.tiny.qwen_vl import SPECIAL_TOKENS, TEXT_DIM, processor, text_encoder

# The released Qwen-Image scheduler config (exponential time shift with a terminal sigma).
SCHEDULER = dict(
    base_image_seq_len=256,
    base_shift=0.5,
    invert_sigmas=False,
    max_image_seq_len=8192,
    max_shift=0.9,
    num_train_timesteps=1000,
    shift=1.0,
    shift_terminal=0.02,
    stochastic_sampling=False,
    time_shift_type="exponential",
    use_beta_sigmas=False,
    use_dynamic_shifting=True,
    use_exponential_sigmas=False,
    use_karras_sigmas=False,
)
_CORPUS = [
    (
        "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
        "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"
    ),
    (
        "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
        "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
        "image that meets the user's requirements while maintaining consistency with the original input where "
        "appropriate.<|im_end|>\n<|im_start|>user\n"
    ),
    "<|im_end|>\n<|im_start|>assistant\n Picture 1: Picture 2: Picture 3:",
    "a photo of a red cat sitting on a blue chair",
    "make the cat green and add a hat; replace the background with a beach",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]


def tokenizer():
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(_CORPUS * 20, vocab_size=800, new_special_tokens=SPECIAL_TOKENS)
    tok.pad_token = "<|endoftext|>"
    return tok


def transformer(*, zero_cond_t: bool = False, layers: int = 2, heads: int = 2, seed: int = 0):
    import torch
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(seed)
    # head dim 16 = the three RoPE axes (frame, height, width)
    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=layers,
        attention_head_dim=16,
        num_attention_heads=heads,
        joint_attention_dim=TEXT_DIM,
        axes_dims_rope=(4, 6, 6),
        zero_cond_t=zero_cond_t,
    ).eval()


def vae(*, stages: int, res_blocks: int, seed: int = 0):
    """x2**(stages-1); the real VAE is 4 stages (x8) with 2 residual blocks each, base width 96."""
    import torch
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(seed)
    return AutoencoderKLQwenImage(
        base_dim=4,
        z_dim=16,
        dim_mult=[1] * stages,
        num_res_blocks=res_blocks,
        temperal_downsample=[False] + [True] * (stages - 2),
    ).eval()


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
