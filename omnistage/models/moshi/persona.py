"""NVIDIA PersonaPlex's persona conditioning: a voice prompt and a text prompt stepped through the LM before a
session's first frame, as PersonaPlex's ``LMGen.step_system_prompts`` does.

In order: the voice (a preset's stored temporal-input embeddings replayed, then its token columns restored), 0.5 s
of silence frames, the text prompt (``<system> ... <system>``, one SentencePiece token per step) and 0.5 s of
silence again. Every prompt frame forces the text token and the model's audio codes (PersonaPlex's fixed codes of
silence, its text padding token 3) and feeds a fixed "sine" frame as the user's codes; what the model draws
meanwhile is discarded.

PersonaPlex steps one frame behind the authors' ``LMGen``: its step writes the frame it is given and runs the
model on the previous column, so it knows the next column's forced tokens. Here, in ``LMGen``'s order, step ``s``
runs the model on column ``s`` and forces column ``s + 1``. The first frame of a PersonaPlex stream is never
stepped (its columns hold the initial tokens). The last prompt step's output, a forced silence frame, is the first
frame PersonaPlex sends, so it is emitted here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnistage.errors import InvalidRequestError

SILENCE_FRAMES = 6  # 0.5 s at 12.5 frames/s, after the voice and after the text
PROMPT_TEXT_TOKEN = 3  # the text stream's padding token, forced while the voice and the silences step
# one prompt token is one model step before the session's first frame: 750 tokens are a minute of frames
MAX_INSTRUCTION_TOKENS = 750


@dataclass
class PromptStep:
    """One model step of a session's prompt, in the authors' ``LMGen`` order (see the module docstring)."""

    user: torch.Tensor  # [8] the user's codes written ``delay`` ahead, as an input frame's
    force: torch.Tensor  # [1 + dep_q] tokens forced at the column this step draws (-1: drawn)
    embed: torch.Tensor | None = None  # [dim] the temporal input, replayed from a voice preset
    restore: torch.Tensor | None = None  # [1 + n_q] the column this step reads, restored from a voice preset
    emit: bool = False  # this step's output frame is sent (the last one)


@dataclass(frozen=True)
class Voice:
    """A PersonaPlex voice preset (``voices/NAME.pt``): the temporal input of each voice step after the first,
    and the token ring (``cache`` [1, 1 + n_q, ring]) as the voice left it."""

    embeddings: torch.Tensor  # [steps, dim]
    cache: torch.Tensor  # [1 + n_q, ring]

    @property
    def frames(self) -> int:
        return self.embeddings.shape[0] + 1

    def column(self, col: int) -> torch.Tensor:
        return self.cache[:, col % self.cache.shape[1]]


def wrap_with_system_tags(text: str) -> str:
    """The text prompt as PersonaPlex tokenizes it: inside ``<system>`` tags, unless it already is."""
    cleaned = text.strip()
    if cleaned.startswith("<system>") and cleaned.endswith("<system>"):
        return cleaned
    return f"<system> {cleaned} <system>"


def load_voice(path: Path, dim: int, rows: int) -> Voice:
    state = torch.load(path, map_location="cpu", weights_only=True)
    embeddings, cache = state.get("embeddings"), state.get("cache")
    if not isinstance(embeddings, torch.Tensor) or not isinstance(cache, torch.Tensor):
        raise ValueError(f"moshi: voice preset {path.name} holds no embeddings and cache")
    embeddings, cache = embeddings.reshape(embeddings.shape[0], -1).float(), cache[0]
    if embeddings.shape[1] != dim or cache.shape[0] != rows:
        raise ValueError(f"moshi: voice preset {path.name} does not fit this checkpoint's shapes")
    return Voice(embeddings, cache)


def find_voice(folder: Path, name: Any) -> Path:
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("voice", f"expected a voice preset's name, got {name!r}")
    stem = name[:-3] if name.endswith(".pt") else name
    voices = folder / "voices"
    path = voices / f"{stem}.pt"
    if "/" in stem or "\\" in stem or stem.startswith(".") or not path.is_file():
        known = sorted(p.stem for p in voices.glob("*.pt")) if voices.is_dir() else []
        raise InvalidRequestError("voice", f"unknown voice {name!r}; this model has {known or 'none'}")
    return path


def text_tokens(tokenizer: Any, instructions: Any) -> list[int]:
    if not isinstance(instructions, str) or not instructions.strip():
        raise InvalidRequestError("instructions", "expected the persona's text prompt, a non-empty string")
    if tokenizer is None:
        raise InvalidRequestError("instructions", "this model folder has no text tokenizer")
    tokens = list(tokenizer.encode(wrap_with_system_tags(instructions)))
    if len(tokens) > MAX_INSTRUCTION_TOKENS:
        raise InvalidRequestError(
            "instructions", f"at most {MAX_INSTRUCTION_TOKENS} tokens (one per 80 ms step), got {len(tokens)}"
        )
    return tokens


def prompt_steps(
    voice: Voice, tokens: list[int], delays: tuple[int, ...], dep_q: int, silence: tuple, sine: tuple
) -> list[PromptStep]:
    """The session's prompt as model steps 0 .. P - 1 (P: the voice's frames, the silences and the tokens)."""
    silent = [(PROMPT_TEXT_TOKEN, silence)] * SILENCE_FRAMES
    later = silent + [(t, silence) for t in tokens] + silent  # frames after the voice: (text, model codes)
    first = voice.frames
    total = first + len(later)
    sine_codes = torch.tensor(sine, dtype=torch.long)
    steps = []
    for s in range(total):
        col = s + 1  # the column this step draws: each codebook's is prompt frame ``col - delay``'s
        force = torch.full((1 + dep_q,), -1, dtype=torch.long)
        for k in range(1 + dep_q):
            frame = col - delays[k]
            if frame >= first and frame < total:
                text, codes = later[frame - first]
                force[k] = text if k == 0 else codes[k - 1]
            elif frame < first and s == first - 1:  # a voice frame's delayed codes, kept in the preset's ring
                force[k] = voice.column(col)[k]
        step = PromptStep(user=sine_codes, force=force, emit=s == total - 1)
        if s < first - 1:  # the voice's steps replay its inputs; what they draw is overwritten by the restore
            step.embed = voice.embeddings[s]
        elif s == first - 1:
            step.restore = voice.column(s)
        steps.append(step)
    return steps
