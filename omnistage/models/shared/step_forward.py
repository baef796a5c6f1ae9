"""One batched forward of a transformers decoder over step-engine rows, each continuing its own cache
(``stages.ar.kv.StepCache``): what the csm backbone and the qwen3_tts / qwen_omni talkers run every step."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.stages.ar.kv import RequestKV, StepCache


def forward_rows(
    decoder: Any,
    kvs: list[RequestKV],
    embeds: torch.Tensor,
    lengths: list[int] | None = None,
    positions: Any = None,
) -> torch.Tensor:
    """``decoder``'s last hidden states [B, T, H] for ``embeds`` [B, T, H] (row i continues ``kvs[i]``;
    ``lengths``: row i's real tokens when right-padded to T). ``positions`` is a callable taking the cache's
    per-row start positions and the query positions ``arange(T)``; by default row i's next T positions."""
    device = embeds.device
    cache = StepCache(kvs, lengths or embeds.shape[1])
    t = torch.arange(embeds.shape[1], device=device)
    pos = positions(cache.starts, t) if positions is not None else torch.stack([s + t for s in cache.starts])
    out = decoder(
        inputs_embeds=embeds,
        position_ids=pos,
        attention_mask=cache.mask(device),
        past_key_values=cache,
        use_cache=True,
    )
    cache.commit()
    return out.last_hidden_state


def last_real(hidden: torch.Tensor, lengths: list[int] | None) -> torch.Tensor:
    """Each row's hidden state [B, H] at its last real position (the last one when not padded)."""
    if lengths is None:
        return hidden[:, -1]
    last = torch.tensor(lengths, device=hidden.device) - 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def rope_delta_positions(deltas: list[int], given: torch.Tensor | None = None) -> Any:
    """``forward_rows``'s positions for a multimodal-RoPE talker: ``given`` [3, B, T] when set, else row i's next
    positions shifted by its rope delta ``deltas[i]``, the same on all three axes."""

    def positions(starts: list[int], t: torch.Tensor) -> torch.Tensor:
        if given is not None:
            return given
        return torch.stack([s + d + t for s, d in zip(starts, deltas)]).unsqueeze(0).expand(3, -1, -1)

    return positions
