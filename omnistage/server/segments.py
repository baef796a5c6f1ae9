"""One window's timestamped tokens cut into segments, as ``vllm serve`` 0.32 cuts them for verbose_json
(``SpeechToTextBaseServing._get_verbose_segments``), for a recogniser whose ``info.transcription`` has
``timestamps`` (Whisper: ``{"timestamp_begin", "seconds_per_timestamp", "tokenizer"}``).

The window's decoder prompt ended in the first timestamp (``<|0.00|>``); every pair of consecutive
timestamps closes a segment: from the timestamp that opened it to the one that closed it, offset by the
window's start, its text the tokenizer's decode of the tokens between (special tokens included, as vLLM
decodes them). A window ending in one timestamp closes its last segment there; text after the window's
last timestamp is left out, as ``vllm serve`` leaves it (openai-whisper would decode that audio again in
the next window; the windows here are cut in advance and run at once). Two differences from ``vllm serve``:
a window with no pair at all — ``vllm serve`` gives it no segment, and drops its text — is one segment over
the whole window here; and a time past the window's audio (a model may write ``<|25.00|>`` in a window of
5 s) is held at the window's end, so segments never overlap the next window or pass the clip's end
(``vllm serve`` reports such times as written).

``avg_logprob`` is vLLM's: the log-probabilities of the tokens after the opening timestamp (text and the
closing timestamp) summed, over the segment's length with both timestamps.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from omnistage.server.transcripts import Segment


@functools.lru_cache(maxsize=4)
def tokenizer(path: str) -> Any:
    """The folder's tokenizer, loaded once (vLLM's ``get_tokenizer`` loads the same one: transformers')."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def window_segments(
    token_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    start: float,
    end: float,
    text: str,
    spec: Mapping[str, Any],
    decode: Callable[[list[int]], str],
    eos: int | None,
    seek: int,
) -> list[Segment]:
    """The window's segments (``text``: its whole text, for a window without a timestamp pair)."""
    begin, step = int(spec["timestamp_begin"]), float(spec["seconds_per_timestamp"])
    tokens = list(token_ids)
    if tokens and tokens[-1] == eos:
        tokens.pop()
    have_lp = logprobs is not None and len(logprobs) >= len(tokens)
    seq = [begin] + tokens  # the prompt's opening <|0.00|> first
    if len(seq) >= 2 and seq[-2] < begin <= seq[-1]:
        seq.append(seq[-1])  # a single timestamp at the end closes the last segment
    out: list[Segment] = []
    first, total = 0, 0.0
    for i in range(1, len(seq)):
        if seq[i] >= begin and seq[i - 1] >= begin:
            piece = seq[first:i]
            opened, closed = (min(start + step * (t - begin), end) for t in (piece[0], piece[-1]))
            out.append(
                Segment(
                    opened,
                    closed,
                    decode(piece[1:-1]),
                    piece[1:-1],
                    avg_logprob=total / (i - first) if have_lp else None,
                    seek=seek,
                )
            )
            first, total = i, 0.0
        elif have_lp:
            total += float(logprobs[i - 1])  # (the token at i is tokens[i - 1])
    if out:
        return out
    mean = sum(logprobs) / len(logprobs) if logprobs else None  # the window's tokens' mean log-probability
    return [Segment(start, end, text, list(token_ids), avg_logprob=mean, seek=seek)]
