"""What a model cannot draw: prompt words outside a closed vocabulary, a word of one kind where another kind goes,
a size it was not trained at.

A pipeline's ``info.vocabulary`` (kind -> words, e.g. the demo's shapes, colours and positions) plus
``info.filler_words`` are every word it was trained on; any other word in a prompt does not reach the
picture, so the caller is told rather than left to wonder why "at the top" came out centred. A word that names a
kind ("background") takes a word of that kind before it: "yellow background" pairs a shape colour with it, which
the model never saw (it draws a yellow shape on a background of its choosing). ``info.trained_sizes`` are the
only sizes such a model draws at. The request still runs: these are warnings, not errors. The server sends them
(omnistage/server/prompt_warnings.py) and ``omnistage generate`` prints them; this module imports nothing heavy,
so the command pays nothing for it.
"""

from __future__ import annotations

import re
from typing import Any

from omnistage.info import PipelineInfo

_WORD = re.compile(r"[^\W_]+")
_MAX_LISTED = 8  # unknown words quoted in one warning; the rest are counted
_MAX_WORD = 32  # characters of one quoted word


def prompt_warnings(info: PipelineInfo, model_name: str, prompt: Any, size: tuple[int, int] | None = None) -> list[str]:
    """The warnings for a prompt (and the ``(width, height)`` it is drawn at): words outside the pipeline's
    vocabulary, words of another kind where a kind's word goes, a size it was not trained at (none: [])."""
    out = []
    if info.vocabulary and isinstance(prompt, str):
        words = _WORD.findall(prompt.lower())
        out += _unknown_words(info, model_name, words) + _misplaced_words(info, model_name, words)
    if size is not None and info.trained_sizes and "{}x{}".format(*size) not in info.trained_sizes:
        trained = " or ".join(info.trained_sizes)
        out.append(
            f"{model_name} was trained on {trained} pictures only: at {size[0]}x{size[1]} it draws shapeless "
            f"colour, not the prompt. Ask for size {info.trained_sizes[0]}"
        )
    return out


def drawn_size(sampling_params: list[Any]) -> tuple[int, int] | None:
    """``(width, height)`` a request draws at: its first stage whose merged params name both (None: unknown, e.g.
    an edit that takes its input's size)."""
    from omnistage.params import DiffusionSamplingParams

    for p in sampling_params:
        if isinstance(p, DiffusionSamplingParams) and p.width is not None and p.height is not None:
            return p.width, p.height
    return None


def _misplaced_words(info: PipelineInfo, model_name: str, words: list[str]) -> list[str]:
    """A kind's name ("background") after a known word of another kind ("yellow"): one warning per pair."""
    vocabulary = info.vocabulary or {}
    pairs = dict.fromkeys(
        (before, word)
        for before, word in zip(words, words[1:])
        if word in vocabulary
        and word in info.filler_words  # a kind's name the captions use ("on a gray background")
        and before not in vocabulary[word]
        and _kind_of(vocabulary, before) is not None
    )
    return [
        f"{model_name} has no {word} {before!r} ({before} is a {_kind_of(vocabulary, before)}), so the picture "
        f"cannot follow {before + ' ' + word!r}. Its {word}s are {', '.join(vocabulary[word])}"
        for before, word in pairs
    ]


def _kind_of(vocabulary: Any, word: str) -> str | None:
    return next((kind for kind, words in vocabulary.items() if word in words), None)


def _unknown_words(info: PipelineInfo, model_name: str, words: list[str]) -> list[str]:
    """One warning naming the words outside the pipeline's vocabulary."""
    vocabulary = info.vocabulary or {}
    known = {w for kind in vocabulary.values() for w in kind} | set(info.filler_words)
    unknown = list(dict.fromkeys(w for w in words if w not in known))
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
