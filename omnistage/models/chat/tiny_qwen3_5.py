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

from omnistage.models.chat.tiny import ROOT
from omnistage.models.chat.tiny_qwen_vl import _save, _text_config, _tokenizer, _vision_config, qwen3_processor


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
    from transformers import GenerationConfig, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    patch = 16
    tok, special = _tokenizer()
    hidden = 2 * head_dim
    rotary_half = head_dim // 8  # partial_rotary_factor 0.25: a quarter of the head turns, split in (t, h, w)
    config = Qwen3_5Config(
        vision_config=_vision_config(hidden, patch, num_layers, num_position_embeddings=64),
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
        **ROOT,
        architectures=["Qwen3_5ForConditionalGeneration"],
    )
    outdir = Path(outdir)
    _save(outdir, Qwen3_5ForConditionalGeneration, config, seed, tok, qwen3_processor(tok, patch))
    # Both ends of a turn stop generation, as in the released checkpoints' generation config: vLLM stops at the
    # tokenizer's eos (<|endoftext|>) anyway, so transformers' generate must too for the two to agree.
    text = config.text_config
    GenerationConfig(
        eos_token_id=[text.eos_token_id, text.bos_token_id],
        bos_token_id=text.bos_token_id,
        pad_token_id=text.pad_token_id,
    ).save_pretrained(outdir)
