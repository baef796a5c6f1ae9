"""Whisper's clips, cases and settings (what all recognisers share: tests/models/asr_cases.py)."""

from __future__ import annotations

from tests.models.asr_cases import clip

ENGINE = dict(max_model_len=448, max_num_seqs=8, dtype="float32", enforce_eager=True)
MAX_TOKENS = 24

CLIPS = [clip(2.0, 1), clip(5.5, 2), clip(11.0, 3)]
# (language, task, previous text) per case; the decoder prompt the family builds from them
CASES = [
    ("en", "transcribe", ""),
    ("de", "transcribe", ""),
    ("fr", "translate", ""),
    ("en", "transcribe", "hello world"),
]


def between_timestamps(segment: list[int], begin: int) -> list[int]:
    """The tokens of a transformers Whisper segment (``generate(return_segments=True)``) without the timestamps
    around them: it keeps the opening one, the closing one, and for an unfinished last segment the next
    pair's first too."""
    inner = segment[1:]
    while inner and inner[-1] >= begin:
        inner.pop()
    return inner
