"""One streaming padding cache per request for VibeVoice's causal convolution stacks (the acoustic decoder and
the semantic encoder), stacked into one batch cache for a batched call and split back after it.

transformers' ``VibeVoiceAcousticTokenizerConv1dPaddingCache`` keeps, per convolution, the last ``left_pad``
input columns of every batch row ([B, C, left_pad], zeros before the first call). transformers' batched
``generate`` advances every row's columns on every frame (rows that are not speaking decode a zero latent);
a request served here advances its own only when it speaks a frame, so that it equals its solo run: the
requests that speak in a step are stacked, decoded together and split back.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
    VibeVoiceAcousticTokenizerConv1dCacheLayer as CacheLayer,
)
from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
    VibeVoiceAcousticTokenizerConv1dPaddingCache as PaddingCache,
)


def _layer(cache: torch.Tensor, like: CacheLayer) -> CacheLayer:
    layer = CacheLayer()
    layer.cache, layer.left_pad, layer.in_channels, layer.is_initialized = cache, like.left_pad, like.in_channels, True
    return layer


def stack(rows: list[PaddingCache | None]) -> PaddingCache | None:
    """The batch cache of ``rows`` (None: a request's first frame, all zeros); None when every row is new (the
    convolutions then start a zero cache of the call's batch size themselves)."""
    if len(rows) == 1:
        return rows[0]
    ref = next((r for r in rows if r is not None), None)
    if ref is None:
        return None
    out = PaddingCache()
    for key, like in ref.layers.items():
        parts = [r.layers[key].cache if r is not None else torch.zeros_like(like.cache) for r in rows]
        out.layers[key] = _layer(torch.cat(parts, dim=0), like)
    return out


def split(cache: Any, n: int) -> list[PaddingCache]:
    """The batch cache after a call -> each row's own (copies: the next stack concatenates them anew)."""
    if n == 1:
        return [cache]
    rows = []
    for i in range(n):
        row = PaddingCache()
        row.layers = {key: _layer(layer.cache[i : i + 1].clone(), layer) for key, layer in cache.layers.items()}
        rows.append(row)
    return rows
