"""``whisper``: speech in, text out — Whisper as one encoder-decoder ``llm`` stage on vLLM.

The stage is vLLM's own ``WhisperForConditionalGeneration`` (runs on vLLM's CPU build too), fed the
explicit encoder-decoder prompt vLLM documents (shared/whisper/prompt.py builds it from a recogniser request), so its
text is token for token vLLM's ``LLM.generate`` on the same prompt, and transformers'
``WhisperForConditionalGeneration.generate`` greedy (tests/models/whisper). Step-level continuous batching
across requests is vLLM's, as for any llm stage.

``info.transcription`` tells the transcription routes how to feed it: the rate to resample to, the
window long audio is cut into (Whisper hears 30 s at a time), the languages and tasks it knows, and — from
the folder's ``generation_config.json`` (``lang_to_id``, as the released checkpoints carry it) — the language
token ids, with which a request that names no language detects it (``language_token_ids``), and the
timestamp tokens (``timestamps``: from ``no_timestamps_token_id``), with which verbose_json / srt / vtt get
Whisper's own segments inside each window: the stage loads Whisper's timestamp rules as a vLLM logits
processor (shared/whisper/timestamps.py, ``TIMESTAMP_RULES``), on only for the requests that ask for timestamps.

Tiny fixture: ``whisper`` (``python -m omnistage.testing.tiny whisper DIR``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.info import PipelineInfo, RecognizerInfo
from omnistage.models.shared.whisper import recognizer_stage
from omnistage.models.shared.whisper.prompt import LANGUAGES, SAMPLE_RATE, TASKS, WINDOW_S, to_encoder_decoder
from omnistage.models.whisper import tiny
from omnistage.pipeline import ModelFolder, Pipeline, read_json

ARCHITECTURES = {"WhisperForConditionalGeneration"}


def matches(folder: ModelFolder) -> bool:
    return folder.is_checkpoint_of(ARCHITECTURES)


TRANSCRIPTION = RecognizerInfo(
    sample_rate=SAMPLE_RATE, window_s=WINDOW_S, languages=tuple(LANGUAGES), tasks=TASKS, default_language="en"
)
SECONDS_PER_TIMESTAMP = 0.02  # <|0.00|>, <|0.02|>, ... <|30.00|>


def folder_info(folder: Path, info: PipelineInfo) -> PipelineInfo:
    """The checkpoint's language tokens (none in an English-only one: it is never asked to detect) and its
    timestamp tokens (what the transcription routes need to cut a window's tokens into segments)."""
    config = read_json(folder / "generation_config.json")
    lang_to_id = config.get("lang_to_id") or {}
    ids = {code: lang_to_id[f"<|{code}|>"] for code in LANGUAGES if f"<|{code}|>" in lang_to_id}
    extra: dict[str, Any] = {"language_token_ids": ids} if ids else {}
    if isinstance(config.get("no_timestamps_token_id"), int):
        extra["timestamps"] = {
            "timestamp_begin": config["no_timestamps_token_id"] + 1,
            "seconds_per_timestamp": SECONDS_PER_TIMESTAMP,
            "tokenizer": str(folder),
        }
    return info.with_transcription(**extra)


WHISPER = Pipeline(
    name="whisper",
    description="Whisper speech recognition / translation to English (encoder-decoder llm stage on vLLM)",
    matches=matches,
    stages=[recognizer_stage(0)],
    shape_request=to_encoder_decoder,  # (token ids out too: verbose_json lists each segment's tokens)
    info=PipelineInfo(transcription=TRANSCRIPTION),
    folder_info=folder_info,
)
PIPELINES = [WHISPER]
TINY = {"whisper": tiny.build}
