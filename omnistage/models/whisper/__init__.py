"""``whisper``: speech in, text out — Whisper as one encoder-decoder ``llm`` stage on vLLM.

The stage is vLLM's own ``WhisperForConditionalGeneration`` (runs on vLLM's CPU build too), fed the
explicit encoder-decoder prompt vLLM documents (prompt.py builds it from a recogniser request), so its
text is token for token vLLM's ``LLM.generate`` on the same prompt, and transformers'
``WhisperForConditionalGeneration.generate`` greedy (tests/models/whisper). Step-level continuous batching
across requests is vLLM's, as for any llm stage.

``info["transcription"]`` tells the transcription routes how to feed it: the rate to resample to, the
window long audio is cut into (Whisper hears 30 s at a time), the languages and tasks it knows, and — from
the folder's ``generation_config.json`` (``lang_to_id``, as the released checkpoints carry it) — the language
token ids, with which a request that names no language detects it (``language_token_ids``).

Tiny fixture: ``whisper`` (``python -m omnistage.testing.tiny whisper DIR``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.models.whisper import tiny
from omnistage.models.whisper.prompt import LANGUAGES, SAMPLE_RATE, TASKS, WINDOW_S, to_encoder_decoder
from omnistage.pipeline import ModelFolder, Pipeline, StageSpec, read_json

ARCHITECTURES = {"WhisperForConditionalGeneration"}


def matches(folder: ModelFolder) -> bool:
    return folder.is_checkpoint_of(ARCHITECTURES)


TRANSCRIPTION = {"sample_rate": SAMPLE_RATE, "window_s": WINDOW_S, "languages": list(LANGUAGES), "tasks": list(TASKS),
                 "default_language": "en"}


def folder_info(folder: Path) -> dict[str, Any]:
    """The checkpoint's language tokens (none in an English-only one: it is never asked to detect)."""
    lang_to_id = read_json(folder / "generation_config.json").get("lang_to_id") or {}
    ids = {code: lang_to_id[f"<|{code}|>"] for code in LANGUAGES if f"<|{code}|>" in lang_to_id}
    return {"transcription": {**TRANSCRIPTION, "language_token_ids": ids}} if ids else {}


WHISPER = Pipeline(
    name="whisper",
    description="Whisper speech recognition / translation to English (encoder-decoder llm stage on vLLM)",
    matches=matches,
    stages=[StageSpec(0, kind="llm", name="recognizer", output="text+token_ids", final=True,
                      default_params={"temperature": 0.0})],
    shape_request=to_encoder_decoder,  # (token ids out too: verbose_json lists each segment's tokens)
    info={"transcription": TRANSCRIPTION},
    folder_info=folder_info,
)
PIPELINES = [WHISPER]
TINY = {"whisper": tiny.build}
