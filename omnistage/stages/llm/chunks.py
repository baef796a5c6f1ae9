"""Async-chunk edge helpers for llm producers (no vLLM import: families use them
in their pipeline declarations)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def every_n_tokens(
    n: int, key: str = "token_ids", out_key: str = "token_ids"
) -> Callable[[dict, Any, dict], dict | None]:
    """An ``Edge.process_chunk`` that forwards the producer's new token ids in
    chunks of ``n``; the tail (< n) is flushed when the producer finishes, so
    the consumer never loses the end of the stream."""
    if n < 1:
        raise ValueError(f"chunk size must be >= 1, got {n}")

    def process_chunk(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
        buf: list[int] = state.setdefault("pending", [])
        new = delta.get(key)
        if new is not None:
            buf.extend(int(t) for t in new)
        if state.get("finished"):
            take = len(buf)
        else:
            take = len(buf) - len(buf) % n  # whole multiples of n only
        if take == 0:
            return None
        chunk, state["pending"] = buf[:take], buf[take:]
        state["sent"] = state.get("sent", 0) + take
        return {out_key: chunk}

    return process_chunk
