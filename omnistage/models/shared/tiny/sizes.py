"""The size fields of the toy transformers that the tiny fixtures share, named as transformers' configs name
them: each family calls these with what differs and adds its own fields."""

from __future__ import annotations


def decoder(
    vocab_size: int,
    hidden: int,
    *,
    layers: int = 2,
    head_dim: int | None = None,
    max_positions: int = 1024,
    ffn: int | None = None,
) -> dict:
    """A decoder-only LM (text model, talker, code predictor): two query heads sharing one key/value head
    (grouped-query attention, as the released models have), a feed-forward ``ffn`` wide (twice ``hidden`` unless
    given); ``head_dim`` None leaves it to the config class."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=ffn or 2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=max_positions,
    )
    return fields if head_dim is None else {**fields, "head_dim": head_dim}


def qwen_vision(hidden: int, out_hidden: int, *, patch: int = 16, depth: int = 1, ffn: int | None = None) -> dict:
    """A Qwen2-VL-style vision tower (Qwen2.5-VL's, Qwen3-VL's, the Qwen-Omni thinkers'): two heads, 2x2 patches
    merged into one token, two frames a temporal patch; ``out_hidden`` is the text model's width."""
    return dict(
        depth=depth,
        hidden_size=hidden,
        intermediate_size=ffn or 2 * hidden,
        num_heads=2,
        out_hidden_size=out_hidden,
        patch_size=patch,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
