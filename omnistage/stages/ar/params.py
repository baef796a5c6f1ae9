"""Checks of an AR speech stage's request parameters (CSM's backbone, Qwen3-TTS's talker): the request's
values over the checkpoint's defaults, each named in the 400 it gets, and the frame chunking of the edge
that streams the stage's codes to its decoder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.pipeline import chunk_size


@dataclass(frozen=True)
class TokenSampling:
    temperature: float  # 0: greedy
    top_k: int
    top_p: float


class StageParams:
    """``params`` (None values dropped) over ``defaults``; keys outside ``keys`` are refused naming ``who``.
    A request that sets ``temperature: 0`` and no ``{inner}temperature`` is greedy in the inner sampler too
    (the depth decoder / code predictor), as a user asking for greedy means."""

    def __init__(self, params: Any, defaults: Mapping[str, Any], keys: set[str], who: str, inner: str):
        params = {k: v for k, v in dict(params or {}).items() if v is not None}
        unknown = sorted(set(params) - keys - {"detokenize"})
        if unknown:
            raise InvalidRequestError(unknown[0], f"not a parameter of {who} (it takes {', '.join(sorted(keys))})")
        self.merged = {**defaults, **params}
        if params.get("temperature") == 0 and inner + "temperature" not in params:
            self.merged[inner + "temperature"] = 0.0

    def number(self, name: str, lo: float, strict: bool = False, integer: bool = False) -> Any:
        v = self.merged[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            raise InvalidRequestError(name, f"expected {'an integer' if integer else 'a number'}, got {v!r}")
        if v < lo or (strict and v == lo):
            raise InvalidRequestError(name, f"must be {'>' if strict else '>='} {lo}, got {v}")
        return v

    def sampler(self, prefix: str = "") -> TokenSampling:
        top_p = float(self.number(prefix + "top_p", 0, strict=True))
        if top_p > 1:
            raise InvalidRequestError(prefix + "top_p", f"must be <= 1, got {top_p}")
        return TokenSampling(
            float(self.number(prefix + "temperature", 0)), int(self.number(prefix + "top_k", 0, integer=True)), top_p
        )

    def seed(self) -> int | None:
        seed = self.merged.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise InvalidRequestError("seed", f"expected a non-negative integer, got {seed!r}")
        return seed


def frames_in_chunks(
    delta: dict[str, Any],
    request: Any,
    state: dict[str, Any],
    *,
    first_default: int,
    every_default: int,
    no_frames: str,
    lookahead: int = 0,
) -> dict[str, Any] | None:
    """One ``token_ids`` row [G codes] per frame in; codes [G, frames] out: the first
    ``initial_codec_chunk_frames`` frames as soon as they exist (with ``lookahead`` more: the frames a
    non-causal decoder needs after a block before it can decode it), then every ``chunk_frames`` (the decoder
    stage's params, per request or deploy), the rest when the AR stage finishes."""
    pending: list[torch.Tensor] = state.setdefault("pending", [])
    if delta.get("token_ids") is not None:
        pending.append(torch.as_tensor(delta["token_ids"]))
    frames = sum(p.shape[0] for p in pending)
    sent = state.get("sent", 0)
    if state.get("finished"):
        take = frames
    elif sent == 0:
        first = chunk_size(request, 1, "initial_codec_chunk_frames", first_default)
        take = frames if frames >= first + lookahead else 0
    else:
        n = chunk_size(request, 1, "chunk_frames", every_default)
        take = frames - frames % n
    if take == 0:
        if state.get("finished") and not sent:
            raise InvalidRequestError("input", no_frames)
        return None
    codes = torch.cat(pending, dim=0)
    pending[:] = [codes[take:]] if take < frames else []
    state["sent"] = sent + take
    return {"codes": codes[:take].T.contiguous(), "streamed": True}
