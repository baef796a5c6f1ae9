"""Tiny Qwen3.5 vision-language model (images and video in, text out) with a locally trained tokenizer.

The real ``Qwen3_5ForConditionalGeneration``: a Qwen3-VL-style ViT (learned position embeddings, patch
merger) in front of the hybrid Qwen3.5 LM, whose layers alternate Gated DeltaNet linear attention (a
recurrent state, no KV cache) with gated full attention using partial interleaved M-RoPE. Random (seeded)
float32 weights; full-attention head size 64 (vLLM's CPU attention takes 32/64/128) with a quarter of it
rotary, as the released models; a working ``Qwen3VLProcessor`` folder (the processor the released
checkpoints name) with the same tiny pixel budgets as the ``qwen3_vl`` fixture. Loads in vLLM and in
transformers; no downloads:

    python -m omnistage.testing.tiny qwen3_5 DIR

vLLM's CPU build runs the Gated DeltaNet layers in bfloat16 only, so the LM keeps the released models'
initializer range (0.02): with the wider 0.3 of the other Qwen-VL fixtures this hybrid LM is chaotic enough
that bfloat16 rounding changed transformers' own greedy answers (against float32) on most seeds tried.
Seed 2 is one whose greedy answers to the test prompts have no near-ties.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.chat.tiny_qwen_vl import CHAT_TEMPLATE, MERGE, _save, _text_config, _tokenizer


def _linear_attention(num_layers: int, full_attention_interval: int) -> dict:
    """The Gated DeltaNet layers' shape, and which layers use it (every ``interval``-th is full attention)."""
    return dict(
        linear_conv_kernel_dim=4,
        # the released size; vLLM's CPU Gated DeltaNet kernel refuses 32 ("Unexpected head dim size")
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=2,
        linear_num_value_heads=4,  # twice the key heads, as the released models (16 / 32)
        layer_types=[
            "full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
            for i in range(num_layers)
        ],
    )


def _mrope_section(rotary_half: int) -> list[int]:
    """The released (11, 11, 10) split of 32 rotary pairs into (t, h, w), scaled to ``rotary_half``."""
    t = (rotary_half * 11 + 16) // 32
    return [t, t, rotary_half - 2 * t]


def build_qwen3_5(
    outdir: Path,
    *,
    seed: int = 2,
    head_dim: int = 64,
    num_layers: int = 2,
    full_attention_interval: int = 2,
    max_position_embeddings: int = 2048,
    initializer_range: float = 0.02,
) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2VLImageProcessor,
        Qwen3_5Config,
        Qwen3_5ForConditionalGeneration,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    patch = 16
    factor = patch * MERGE  # 32 px: one merged token
    tok, special = _tokenizer()
    hidden = 2 * head_dim
    rotary_half = head_dim // 8  # partial_rotary_factor 0.25: a quarter of the head turns, split in (t, h, w)
    config = Qwen3_5Config(
        vision_config=dict(
            depth=num_layers,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_heads=2,
            patch_size=patch,
            spatial_merge_size=MERGE,
            temporal_patch_size=2,
            out_hidden_size=hidden,
            num_position_embeddings=64,
            initializer_range=0.3,
        ),
        text_config=_text_config(
            tok,
            hidden,
            num_layers,
            max_position_embeddings,
            head_dim=head_dim,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e7,
                "partial_rotary_factor": 0.25,
                "mrope_interleaved": True,
                "mrope_section": _mrope_section(rotary_half),
            },
            **_linear_attention(num_layers, full_attention_interval),
        )
        | {"initializer_range": initializer_range},
        **special,
        tie_word_embeddings=False,
        torch_dtype="float32",
        architectures=["Qwen3_5ForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).to(torch.float32).eval()
    common = dict(patch_size=patch, merge_size=MERGE, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    images = Qwen2VLImageProcessor(min_pixels=factor**2, max_pixels=4 * factor**2, **common)
    # the video budget counts all sampled frames together (frames x height x width)
    videos = Qwen3VLVideoProcessor(
        size={"shortest_edge": factor**2, "longest_edge": 16 * factor**2}, fps=2, min_frames=2, max_frames=8, **common
    )
    outdir = Path(outdir)
    _save(
        outdir,
        model,
        tok,
        Qwen3VLProcessor(image_processor=images, tokenizer=tok, video_processor=videos, chat_template=CHAT_TEMPLATE),
    )
    # Both ends of a turn stop generation, as in the released checkpoints' generation config: vLLM stops at the
    # tokenizer's eos (<|endoftext|>) anyway, so transformers' generate must too for the two to agree.
    text = config.text_config
    GenerationConfig(
        eos_token_id=[text.eos_token_id, text.bos_token_id],
        bos_token_id=text.bos_token_id,
        pad_token_id=text.pad_token_id,
    ).save_pretrained(outdir)
