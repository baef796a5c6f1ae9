"""Qwen-Image's parts at toy size (the qwen_image and qwen_image_layered families' fixtures): the released scheduler
config, a byte-level BPE ``Qwen2Tokenizer`` trained locally with Qwen's special tokens (on the prompt templates too,
so that they tokenize to the 34 / 64 tokens the pipelines drop, as with Qwen's own tokenizer),
``QwenImageTransformer2DModel`` and ``AutoencoderKLQwenImage``."""

from __future__ import annotations

import string

from omnistage.models.shared.tiny.qwen_vl import SPECIAL_TOKENS, TEXT_DIM

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


def transformer(*, zero_cond_t: bool = False, layers: int = 2, heads: int = 2, seed: int = 0, **config):
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
        **config,
    ).eval()


def vae(*, stages: int, res_blocks: int, seed: int = 0, channels: int = 3):
    """x2**(stages-1); the real VAE is 4 stages (x8) with 2 residual blocks each, base width 96; ``channels``: the
    pixels' (3, RGB; Qwen-Image-Layered's 4, RGBA)."""
    import torch
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(seed)
    return AutoencoderKLQwenImage(
        base_dim=4,
        z_dim=16,
        dim_mult=[1] * stages,
        num_res_blocks=res_blocks,
        temperal_downsample=[False] + [True] * (stages - 2),
        input_channels=channels,
    ).eval()
