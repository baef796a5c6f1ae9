"""Token timing for one streamed chat response (TTFT, TPOT, inter-token latency).

Rules:
- Output tokens come from what the server reports -- ``usage.completion_tokens``
  (preferred) or a server metrics field -- never from counting SSE chunks.
  Counts are cumulative (``stream_options.continuous_usage_stats``); a chunk
  that carries only a count (no text, e.g. the final usage chunk or a metrics
  chunk) updates the count of the text already received.
- Chunks without text (the initial role chunk, empty deltas) do not count for
  TTFT or ITL.
- A text chunk whose count rose by k splits the interval since the previous
  counted text chunk into k equal ITL entries; text chunks with no new count
  extend the interval until a count arrives. Hence, when counts are complete,
  ``e2e_text - ttft == sum(itl)`` and ``len(itl) == tokens - tokens_in_first_chunk``.
- TPOT is the mean ITL of the request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Metric fields a server may use for generated-token counts, in preference order.
_METRIC_TOKEN_KEYS = ("completion_tokens", "num_output_tokens", "num_tokens")


def reported_token_count(chunk: dict[str, Any]) -> int | None:
    """Cumulative output-token count a chunk reports: usage first, then metrics."""
    usage = chunk.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"]
    return metrics_token_count(chunk)


def metrics_token_count(chunk: dict[str, Any]) -> int | None:
    metrics = chunk.get("metrics")
    if isinstance(metrics, dict):
        for key in _METRIC_TOKEN_KEYS:
            if isinstance(metrics.get(key), int):
                return metrics[key]
    # Per-stage metrics: the text comes from the first (lowest-id) stage that reports tokens.
    stages = chunk.get("stage_metrics")
    if isinstance(stages, dict):
        stages = [stages[k] for k in sorted(stages, key=_stage_sort_key)]
    if isinstance(stages, list):
        for entry in stages:
            if isinstance(entry, dict):
                for key in _METRIC_TOKEN_KEYS:
                    if isinstance(entry.get(key), int) and entry[key] > 0:
                        return entry[key]
    return None


def chunk_text(chunk: dict[str, Any]) -> str:
    """Visible text a chat chunk carries (content and reasoning), '' for role/audio chunks."""
    if chunk.get("modality", "text") != "text":
        return ""
    parts = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if not isinstance(delta, dict):
            continue
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str) and value:
                parts.append(value)
    return "".join(parts)


@dataclass
class TextStreamStats:
    ttft: float | None = None  # s, start -> first text chunk
    e2e_text: float | None = None  # s, start -> last text chunk
    itl: list[float] = field(default_factory=list)  # s, one entry per token after the first chunk
    output_tokens: int | None = None  # as reported by the server; None when it never said
    text: str = ""

    @property
    def tpot(self) -> float | None:
        return sum(self.itl) / len(self.itl) if self.itl else None


@dataclass
class _TextEvent:
    t: float
    count: int | None


class TextStreamTracker:
    """Feed parsed SSE chunks with their arrival times; ``finish()`` gives the stats."""

    def __init__(self, start: float):
        self.start = start
        self._events: list[_TextEvent] = []
        self._last_count: int | None = None
        self._text: list[str] = []

    def on_chunk(self, t: float, chunk: dict[str, Any]) -> None:
        count = reported_token_count(chunk)
        if count is not None:
            self._last_count = count if self._last_count is None else max(self._last_count, count)
        text = chunk_text(chunk)
        if text:
            self._text.append(text)
            self._events.append(_TextEvent(t, count))
        elif count is not None and self._events:
            # A count-only chunk: the tokens it adds were delivered with the text before it.
            self._events[-1].count = count

    def finish(self) -> TextStreamStats:
        stats = TextStreamStats(output_tokens=self._last_count, text="".join(self._text))
        if not self._events:
            return stats
        first, last = self._events[0], self._events[-1]
        stats.ttft = first.t - self.start
        stats.e2e_text = last.t - self.start
        if self._last_count is None:
            return stats  # no count from the server: token timing is unknown, not guessed
        # The first text chunk carries at least one token; its tokens belong to TTFT.
        prev_t, prev_c = first.t, max(first.count or 1, 1)
        for ev in self._events[1:]:
            if ev.count is None or ev.count <= prev_c:
                continue  # no new count yet: the interval runs on to the next counted chunk
            k = ev.count - prev_c
            stats.itl.extend([(ev.t - prev_t) / k] * k)
            prev_t, prev_c = ev.t, ev.count
        if last.t > prev_t and stats.itl:
            stats.itl[-1] += last.t - prev_t  # trailing text with no new count: keep the time
        return stats


def _stage_sort_key(key: Any) -> tuple[int, str]:
    try:
        return (int(key), "")
    except (TypeError, ValueError):
        return (1 << 30, str(key))
