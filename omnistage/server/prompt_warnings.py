"""Warnings about prompt words a model cannot draw, for pipelines that declare a closed vocabulary.

A pipeline's ``info.vocabulary`` (kind -> words, e.g. the demo's shapes, colours and positions) plus
``info.filler_words`` are every word it was trained on; any other word in a prompt does not reach the
picture, so the caller is told rather than left to wonder why "at the top" came out centred. The request still
runs: a warning, not an error. Routes send them as ``X-Omnistage-Warning`` headers (ASCII, one per warning)
and, where the response body has room, a ``warnings`` list (docs/server.md).
"""

from __future__ import annotations

import re
from typing import Any

from omnistage.info import PipelineInfo

HEADER = "X-Omnistage-Warning"
_WORD = re.compile(r"[^\W_]+")
_MAX_LISTED = 8  # unknown words quoted in one warning; the rest are counted
_MAX_WORD = 32  # characters of one quoted word


def prompt_warnings(info: PipelineInfo, model_name: str, prompt: Any) -> list[str]:
    """One warning naming the prompt's words outside the pipeline's vocabulary (none: an empty list)."""
    vocabulary = info.vocabulary
    if not vocabulary or not isinstance(prompt, str):
        return []
    known = {w for words in vocabulary.values() for w in words} | set(info.filler_words)
    unknown = list(dict.fromkeys(w for w in _WORD.findall(prompt.lower()) if w not in known))
    if not unknown:
        return []
    quoted = ", ".join(repr(w[:_MAX_WORD]) for w in unknown[:_MAX_LISTED])
    if len(unknown) > _MAX_LISTED:
        quoted += f" and {len(unknown) - _MAX_LISTED} more"
    kinds = "; ".join(f"{kind}: {', '.join(words)}" for kind, words in vocabulary.items())
    return [
        f"{model_name} was not trained on {quoted}, so the picture cannot follow "
        f"{'it' if len(unknown) == 1 else 'them'}. It knows {kinds}"
    ]


def warning_headers(warnings: list[str]) -> list[tuple[str, str]]:
    """``(name, value)`` header pairs: HTTP header values are printable ASCII here, so other characters (and
    control characters, e.g. from a key name the caller sent) are escaped."""
    return [(HEADER, _CONTROL.sub(_escape, w.encode("ascii", "backslashreplace").decode("ascii"))) for w in warnings]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _escape(m: re.Match) -> str:
    return f"\\x{ord(m.group()):02x}"
