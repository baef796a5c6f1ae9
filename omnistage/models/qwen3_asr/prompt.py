"""Qwen3-ASR's prompt and the request shape the family takes (no torch, no vLLM).

A recogniser request (``{"prompt": previous text, "multi_modal_data": {"audio": ...},
"transcription": Transcription(language, task)}``, the shape the transcription routes build, see
omnistage/models/shared/whisper/prompt.py) becomes the ChatML prompt vLLM's own Qwen3-ASR transcription prompt
writes (``get_generation_prompt``) and transformers' ``Qwen3ASRProcessor.apply_transcription_request``
renders: the previous text as the system turn (only when given), the audio as the user turn, and the
assistant turn begun with ``language English<asr_text>``, which forces the language — the model then
writes the transcript alone. With no language (``None``) the assistant turn is left empty and the model
writes that prefix itself, as vLLM's server and transformers prompt it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.speech import Transcription

SAMPLE_RATE = 16000
WINDOW_S = 30  # the feature extractor's chunk_length: what vLLM's server cuts long audio into
DEFAULT_MAX_TOKENS = 256
AUDIO = "<|audio_start|><|audio_pad|><|audio_end|>"
# The languages Qwen3-ASR was trained on, by the names its forced-language prefix uses
# (tests/models/qwen3_asr compares the table with transformers' LANGUAGE_CODE_TO_NAME).
LANGUAGES = {
    "zh": "Chinese",
    "en": "English",
    "yue": "Cantonese",
    "ar": "Arabic",
    "de": "German",
    "fr": "French",
    "es": "Spanish",
    "pt": "Portuguese",
    "id": "Indonesian",
    "it": "Italian",
    "ko": "Korean",
    "ru": "Russian",
    "th": "Thai",
    "vi": "Vietnamese",
    "ja": "Japanese",
    "tr": "Turkish",
    "hi": "Hindi",
    "ms": "Malay",
    "nl": "Dutch",
    "sv": "Swedish",
    "da": "Danish",
    "fi": "Finnish",
    "pl": "Polish",
    "cs": "Czech",
    "fil": "Filipino",
    "fa": "Persian",
    "el": "Greek",
    "hu": "Hungarian",
    "mk": "Macedonian",
    "ro": "Romanian",
}
# the previous text must not open turns of its own (as vLLM sanitises it)
_CONTROL = re.compile(r"<\|[^|]+\|>|<asr_text>")


# with no language forced the model writes it first (``language German<asr_text>...``): what the transcription
# routes strip (omnistage.server.transcripts.LanguagePrefix; names lowercase, matched case-blind)
LANGUAGE_PREFIX = {
    "tag": "<asr_text>",
    "lead": "language ",
    "names": {name.lower(): code for code, name in LANGUAGES.items()},
}


def chat_prompt(language: str | None, previous: str = "") -> str:
    context = _CONTROL.sub("", previous).strip()
    system = f"<|im_start|>system\n{context}<|im_end|>\n" if context else ""
    forced = f"language {LANGUAGES[language]}<asr_text>" if language else ""
    return f"{system}<|im_start|>user\n{AUDIO}<|im_end|>\n<|im_start|>assistant\n{forced}"


def to_chat_prompt(prompt: dict[str, Any], params: list[Any]) -> None:
    """The family's request hook: a recogniser request becomes Qwen3-ASR's prompt (in place); a request
    without ``transcription`` (an explicit prompt) passes as it is."""
    if isinstance(params[0], dict):
        params[0].setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    info: Transcription | None = prompt.pop("transcription", None)
    if info is None:
        return
    mm = prompt.get("multi_modal_data")
    if not isinstance(mm, Mapping) or mm.get("audio") is None:
        raise InvalidRequestError("multi_modal_data.audio", "a Qwen3-ASR request needs the audio to transcribe")
    language = info.language  # None: the model names it before the transcript (LANGUAGE_PREFIX)
    if language is not None and language.lower() not in LANGUAGES:
        raise InvalidRequestError(
            "language", f"{language!r} is not a language Qwen3-ASR knows ({', '.join(LANGUAGES)})"
        )
    if info.task != "transcribe":
        raise InvalidRequestError("task", "Qwen3-ASR only transcribes")
    previous = prompt.get("prompt") or ""
    if not isinstance(previous, str):
        raise InvalidRequestError("prompt", f"expected a string, got {type(previous).__name__}")
    prompt["prompt"] = chat_prompt(language.lower() if language else None, previous)
