"""Tiny Qwen2.5-VL and Qwen3-VL (images and video in, text out) with a locally trained tokenizer.

The real ``Qwen2_5_VLForConditionalGeneration`` (window-attention ViT, patch merger, Qwen2 LM
with M-RoPE) and ``Qwen3VLForConditionalGeneration`` (ViT with learned position embeddings and
DeepStack, Qwen3 LM with interleaved M-RoPE) architectures, random (seeded) float32 weights, head
size 32 by default (vLLM's CPU attention takes 32/64/128), and working ``Qwen2_5_VLProcessor`` /
``Qwen3VLProcessor`` folders with their image and video processors. Pixel budgets are tiny so a
prompt stays short: an image is at most 2x2 merged tokens; a video frame pair (temporal patch 2)
is at most 2x3 merged tokens (Qwen2.5-VL) and a whole Qwen3-VL video at most 16 merged tokens.
They load in vLLM and in transformers; no downloads:

    python -m omnistage.testing.tiny qwen2_5_vl DIR
    python -m omnistage.testing.tiny qwen3_vl DIR
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.chat.tiny import ROOT, save_multimodal, text_config, train_tokenizer
from omnistage.models.shared.tiny.sizes import qwen_vision

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
MERGE = 2  # spatial merge (2x2 patches -> one LM token), as the released models

# The released models' chat template, trimmed to text / image / video parts (no tools).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' or 'image' in c or 'image_url' in c %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' or 'video' in c or 'video_url' in c %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in c %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer():
    tok = train_tokenizer(extra_special_tokens=VISION_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    special = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }
    return tok, special


def _text_config(tok, hidden: int, num_layers: int, max_position_embeddings: int, **extra):
    return text_config(tok, hidden, num_layers, max_position_embeddings, rms_norm_eps=1e-6, **extra)


def _vision_config(hidden: int, patch: int, num_layers: int, **extra) -> dict:
    return dict(qwen_vision(hidden, hidden, patch=patch, depth=num_layers), initializer_range=0.3, **extra)


def _save(outdir: Path, model_class, config, seed: int, tok, processor) -> None:
    save_multimodal(outdir, model_class, config, seed)
    processor.save_pretrained(outdir)
    tok.save_pretrained(outdir)


def qwen3_processor(tok, patch: int):
    """Qwen3-VL's processor with tiny pixel budgets (an image at most 2x2 merged tokens, a whole video 16)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    factor = patch * MERGE  # one merged token
    common = dict(patch_size=patch, merge_size=MERGE, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    images = Qwen2VLImageProcessor(min_pixels=factor**2, max_pixels=4 * factor**2, **common)
    # Qwen3-VL's video budget counts all sampled frames together (frames x height x width)
    videos = Qwen3VLVideoProcessor(
        size={"shortest_edge": factor**2, "longest_edge": 16 * factor**2}, fps=2, min_frames=2, max_frames=8, **common
    )
    return Qwen3VLProcessor(image_processor=images, tokenizer=tok, video_processor=videos, chat_template=CHAT_TEMPLATE)


def build_qwen2_5_vl(
    outdir: Path, *, seed: int = 0, head_dim: int = 32, num_layers: int = 2, max_position_embeddings: int = 2048
) -> None:
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    patch = 14
    factor = patch * MERGE  # 28 px: one merged token
    tok, special = _tokenizer()
    hidden = 2 * head_dim  # two heads; the LM's head size is hidden / heads
    half = head_dim // 2  # M-RoPE splits the rotary half of each head into (t, h, w) sections
    config = Qwen2_5_VLConfig(
        vision_config=_vision_config(
            hidden,
            patch,
            num_layers,
            window_size=2 * factor,
            fullatt_block_indexes=[num_layers - 1],
            tokens_per_second=2,
        ),
        text_config=_text_config(
            tok,
            hidden,
            num_layers,
            max_position_embeddings,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e6,
                "mrope_section": [half // 4, 3 * half // 8, 3 * half // 8],
            },
        ),
        **special,
        **ROOT,
        architectures=["Qwen2_5_VLForConditionalGeneration"],
    )
    common = dict(patch_size=patch, merge_size=MERGE, temporal_patch_size=2)
    images = Qwen2VLImageProcessor(min_pixels=factor**2, max_pixels=4 * factor**2, **common)
    videos = Qwen2VLVideoProcessor(min_pixels=factor**2, max_pixels=6 * factor**2, **common)  # per frame
    _save(
        Path(outdir),
        Qwen2_5_VLForConditionalGeneration,
        config,
        seed,
        tok,
        Qwen2_5_VLProcessor(image_processor=images, tokenizer=tok, video_processor=videos, chat_template=CHAT_TEMPLATE),
    )


def build_qwen3_vl(
    outdir: Path, *, seed: int = 0, head_dim: int = 32, num_layers: int = 2, max_position_embeddings: int = 2048
) -> None:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    patch = 16
    tok, special = _tokenizer()
    hidden = 2 * head_dim
    half = head_dim // 2
    t_sec = half - 2 * (5 * half // 16)  # the released (24, 20, 20) of 64, scaled
    config = Qwen3VLConfig(
        vision_config=_vision_config(
            hidden, patch, num_layers, num_position_embeddings=64, deepstack_visual_indexes=[0]
        ),
        text_config=_text_config(
            tok,
            hidden,
            num_layers,
            max_position_embeddings,
            head_dim=head_dim,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5e6,
                "mrope_interleaved": True,
                "mrope_section": [t_sec, 5 * half // 16, 5 * half // 16],
            },
        ),
        **special,
        **ROOT,
        architectures=["Qwen3VLForConditionalGeneration"],
    )
    _save(Path(outdir), Qwen3VLForConditionalGeneration, config, seed, tok, qwen3_processor(tok, patch))
