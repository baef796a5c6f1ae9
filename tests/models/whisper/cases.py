"""Clips and settings shared by the Whisper parity tests (and the transcription route's)."""

from __future__ import annotations

import numpy as np

ENGINE = dict(max_model_len=448, max_num_seqs=8, dtype="float32", enforce_eager=True)
MAX_TOKENS = 24
RATE = 16000


def clip(seconds: float, seed: int, rate: int = RATE) -> np.ndarray:
    """A deterministic tone-and-noise clip (float32 mono)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    freq = 220.0 * (1 + seed % 5)
    return (0.3 * np.sin(2 * np.pi * freq * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


CLIPS = [clip(2.0, 1), clip(5.5, 2), clip(11.0, 3)]
# (language, task, previous text) per case; the decoder prompt the family builds from them
CASES = [("en", "transcribe", ""), ("de", "transcribe", ""), ("fr", "translate", ""),
         ("en", "transcribe", "hello world")]


def between_timestamps(segment: list[int], begin: int) -> list[int]:
    """The tokens of a transformers Whisper segment (``generate(return_segments=True)``) without the timestamps
    around them: it keeps the opening one, the closing one, and for an unfinished last segment the next
    pair's first too."""
    inner = segment[1:]
    while inner and inner[-1] >= begin:
        inner.pop()
    return inner
