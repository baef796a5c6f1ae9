"""The edge from the speech LM to the codec decoder: codec token ids -> codes [K, frames].

The LM stage describes its token layout in its first output (``codec_layout``:
offset, codebook size, K, layout, end id, chunk sizes, the codec stage's
lookahead, and a cloned voice's reference codes as ``context_codes``), so these
functions need no model folder. The first piece sent on carries the reference
codes as ``context`` (the codec decodes them in front of the speech). Tokens are flattened frame-major (frame 0's K tokens,
then frame 1's ...). The end token and anything after it are dropped; an
incomplete last frame (max_tokens cut the frame) is dropped too.
"""

from __future__ import annotations

from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.pipeline import chunk_size

LAYOUT_KEY = "codec_layout"
# The LM ended before one whole frame: no audio to send (an empty WAV would hide it). The text is the only
# thing the caller controls that led there, so it is a 400 naming ``input`` rather than a server fault.
NO_FRAMES = "the speech LM produced no complete codec frame for this input (it stopped at once; try min_tokens)"


def _layout(source: dict[str, Any]) -> dict[str, Any]:
    layout = source.get(LAYOUT_KEY)
    if isinstance(layout, list):  # an auxiliary key accumulates as a list of items
        layout = layout[0] if layout else None
    if not isinstance(layout, dict):
        raise RuntimeError(f"the speech LM stage sent no {LAYOUT_KEY!r} (is it the codec_tts LM engine?)")
    return layout


def tokens_to_codes(ids: list[int], layout: dict[str, Any], start: int = 0):
    """Whole frames of ``ids`` as a LongTensor [K, frames]; ``start`` is the position of ``ids[0]``
    in the generated sequence (for error messages and the codebook of each position)."""
    import torch

    k, size, offset = layout["num_quantizers"], layout["codebook_size"], layout["codec_token_offset"]
    per_codebook = layout["layout"] == "per_codebook"
    frames = len(ids) // k
    codes = torch.empty(k, frames, dtype=torch.long)
    for i, tok in enumerate(ids[: frames * k]):
        q = (start + i) % k
        lo = offset + (q * size if per_codebook else 0)
        if not lo <= tok < lo + size:
            raise ValueError(
                f"token_ids[{start + i}]: {tok} is not a codec token of codebook {q} (expected {lo}..{lo + size - 1})"
            )
        codes[q, i // k] = tok - lo
    return codes


def _until_end(ids: list[int], end_id: int | None) -> tuple[list[int], bool]:
    if end_id is not None and end_id in ids:
        return ids[: ids.index(end_id)], True
    return ids, False


def _context(layout: dict[str, Any]) -> dict[str, Any]:
    import torch

    ctx = layout.get("context_codes")
    return {} if ctx is None else {"context": torch.as_tensor(ctx, dtype=torch.long)}


def whole_codes(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """Non-streamed path: every generated token at once."""
    layout = _layout(source)
    raw = source.get("token_ids")
    ids = raw.tolist() if hasattr(raw, "tolist") else list(raw or [])
    ids, _ = _until_end(ids, layout.get("end_id"))
    codes = tokens_to_codes(ids, layout)
    if codes.shape[1] == 0:
        raise InvalidRequestError("input", NO_FRAMES)
    return {"codes": codes, **_context(layout)}


def codes_every_n_frames(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    """Streaming path: the first ``initial_codec_chunk_frames`` (+ the codec's lookahead) complete frames
    as soon as they exist, then every ``chunk_frames``; the tail when the LM finishes."""
    if LAYOUT_KEY in delta:
        state["layout"] = _layout(delta)
    layout = state.get("layout")
    if layout is None:
        if state.get("finished"):
            raise RuntimeError(f"the speech LM stage finished without sending {LAYOUT_KEY!r}")
        return None
    pending: list[int] = state.setdefault("pending", [])
    if not state.get("ended") and delta.get("token_ids") is not None:
        new, ended = _until_end([int(t) for t in delta["token_ids"]], layout.get("end_id"))
        pending.extend(new)
        state["ended"] = ended
    k = layout["num_quantizers"]
    n = chunk_size(request, 1, "chunk_frames", layout["chunk_frames"])
    frames = len(pending) // k
    start = state.get("sent", 0)
    if state.get("finished"):
        take = frames
    elif start == 0:
        first = chunk_size(request, 1, "initial_codec_chunk_frames", layout.get("initial_chunk_frames") or n)
        take = frames if frames >= first + layout.get("lookahead_frames", 0) else 0
    else:
        take = frames - frames % n
    if take == 0:
        if state.get("finished") and not state.get("sent"):
            raise InvalidRequestError("input", NO_FRAMES)
        return None
    codes = tokens_to_codes(pending[: take * k], layout, start)
    del pending[: take * k]
    state["sent"] = start + take * k
    return {"codes": codes, "streamed": True, **(_context(layout) if start == 0 else {})}
