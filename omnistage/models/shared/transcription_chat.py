"""Chat models as speech recognisers (the Qwen-Omni thinkers, Qwen2-Audio): the recogniser request the
transcription routes send becomes a chat turn of the model's own (no torch, no vLLM here). Shared by the
``qwen_omni``, ``qwen2_5_omni`` and ``chat`` families, so it belongs to none of them.

A recogniser request is ``{"prompt": previous text, "multi_modal_data": {"audio": (samples, rate)},
"transcription": Transcription(language=..., task="transcribe" | "translate")}`` (omnistage/models/shared/
whisper/prompt.py). The hook turns it into one user message — the audio, then an instruction worded as vLLM's own
Qwen3-Omni ``get_generation_prompt`` words it ("Transcribe this audio into English.", the previous text after
it) — which the thinker renders with the checkpoint's chat template, as any chat turn. Decoding is greedy
unless the request says otherwise (OpenAI's transcription default, temperature 0).

The audio travels as a float32 WAV ``input_audio`` part: vLLM's chat parser takes media only as parts, and a
float WAV decodes back to exactly the samples the route decoded. Only the thinker runs: the routes ask for
text out, so the talker never starts for these requests.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.info import RecognizerInfo
from omnistage.speech import Transcription

SAMPLE_RATE = 16000  # the audio encoder's feature extractor
WINDOW_S = 30  # the feature extractor's chunk_length (vLLM's speech-to-text config cuts there too)
DEFAULT_MAX_TOKENS = 448  # one 30 s window's text (Whisper's whole text context) is never longer
TASKS = ("transcribe", "translate")
# ISO 639-1 -> the name the instruction uses: the speech languages Qwen3-Omni's and Qwen2.5-Omni's cards list
LANGUAGES = {
    "en": "English",
    "zh": "Chinese",
    "yue": "Cantonese",
    "ja": "Japanese",
    "ko": "Korean",
    "de": "German",
    "fr": "French",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "ru": "Russian",
    "nl": "Dutch",
    "tr": "Turkish",
    "ar": "Arabic",
    "vi": "Vietnamese",
    "id": "Indonesian",
    "ms": "Malay",
    "ur": "Urdu",
    "th": "Thai",
    "hi": "Hindi",
}

# what the transcription routes read (server/routes/transcriptions.py)
TRANSCRIPTION_INFO = RecognizerInfo(
    sample_rate=SAMPLE_RATE, window_s=WINDOW_S, languages=tuple(LANGUAGES), tasks=TASKS, default_language="en"
)


def instruction(language: str, task: str, previous: str = "") -> str:
    if task == "transcribe":
        text = f"Transcribe this audio into {LANGUAGES[language]}."
    else:
        text = "Translate this audio" + ("" if language == "en" else f" from {LANGUAGES[language]}") + " into English."
    return text + (f" {previous.strip()}" if previous.strip() else "")


def float_wav(samples: Any, rate: int) -> str:
    import numpy as np
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, np.asarray(samples, dtype=np.float32), int(rate), format="WAV", subtype="FLOAT")
    return base64.b64encode(buf.getvalue()).decode()


def is_recognition(prompt: Mapping[str, Any]) -> bool:
    return prompt.get("transcription") is not None and prompt.get("messages") is None


def to_transcription_chat(prompt: dict[str, Any], params: list[Any]) -> None:
    """The families' request hook: a recogniser request becomes the thinker's chat turn (in place); any other
    request passes as it is."""
    if not is_recognition(prompt):
        return
    info: Transcription = prompt.pop("transcription")
    task = info.task
    if task not in TASKS:
        raise InvalidRequestError("task", f"expected one of {', '.join(TASKS)}, got {task!r}")
    language = info.language or "en"
    if language.lower() not in LANGUAGES:
        raise InvalidRequestError(
            "language", f"{language!r} is not a language this model transcribes ({', '.join(LANGUAGES)})"
        )
    mm = prompt.pop("multi_modal_data", None)
    audio = mm.get("audio") if isinstance(mm, Mapping) else None
    if not (isinstance(audio, (list, tuple)) and len(audio) == 2 and isinstance(audio[1], (int, float))):
        raise InvalidRequestError(
            "multi_modal_data.audio", "a transcription request needs the audio as (samples, sample rate)"
        )
    previous = prompt.pop("prompt", None) or ""
    if not isinstance(previous, str):
        raise InvalidRequestError("prompt", f"expected a string, got {type(previous).__name__}")
    prompt["messages"] = [
        {
            "role": "user",
            "content": [
                {"type": "input_audio", "input_audio": {"data": float_wav(*audio), "format": "wav"}},
                {"type": "text", "text": instruction(language.lower(), task, previous)},
            ],
        }
    ]
    if isinstance(params[0], dict):
        params[0].setdefault("temperature", 0.0)
        params[0].setdefault("max_tokens", DEFAULT_MAX_TOKENS)
