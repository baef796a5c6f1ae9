"""Voxtral's transcription prompt and the request shape the family takes (no torch, no vLLM).

A recogniser request (``{"prompt": previous text, "multi_modal_data": {"audio": (samples, rate)},
"transcription": Transcription(language, task)}``, the shape the transcription routes build, see
omnistage/models/shared/whisper/prompt.py) becomes the token prompt vLLM's own Voxtral transcription prompt builds
(``get_generation_prompt``): mistral_common's ``TranscriptionRequest`` encoded by the folder's ``tekken.json``
— ``<s>[INST][BEGIN_AUDIO]`` + one ``[AUDIO]`` per 80 ms of the audio padded to whole 30 s chunks +
``[/INST]``, then ``lang:de`` when a language is given, then ``[TRANSCRIBE]`` — and the padded audio it encodes
(the audio goes through a 16-bit WAV first, as vLLM's server sends it). With no language the prompt names none
and the model hears it. Voxtral's request has no previous text: ``prompt`` is ignored, as ``vllm serve``
ignores it. mistral_common (a dependency of vLLM, which the stage runs on) is imported only when a Voxtral
folder is served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.speech import Transcription

SAMPLE_RATE = 16000
WINDOW_S = 30  # the tokenizer's chunk_length_s: vLLM's server cuts long audio into these too
DEFAULT_MAX_TOKENS = 256
# the languages Voxtral's model card lists, as vLLM 0.32's Voxtral names them (its supported_languages;
# tests/models/voxtral compares the two)
LANGUAGES = {
    "ar": "Arabic",
    "nl": "Dutch",
    "en": "English",
    "fr": "French",
    "de": "German",
    "hi": "Hindi",
    "it": "Italian",
    "pt": "Portuguese",
    "es": "Spanish",
}
# vLLM's load of Mistral's layout (the only one its Voxtral reads): params.json, tekken.json, consolidated.safetensors
ENGINE_ARGS = {"tokenizer_mode": "mistral", "config_format": "mistral", "load_format": "mistral"}


@lru_cache(maxsize=8)
def _instruct_tokenizer(tekken: str) -> Any:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(tekken).instruct_tokenizer


def transcription_prompt(folder: str | Path, samples: Any, rate: int, language: str | None) -> dict[str, Any]:
    """The engine prompt for one window: token ids and the padded audio they stand for."""
    import numpy as np
    from mistral_common.protocol.transcription.request import TranscriptionRequest
    from mistral_common.tokens.tokenizers.audio import Audio

    tokenizer = _instruct_tokenizer(str(Path(folder) / "tekken.json"))
    audio = Audio(np.asarray(samples, dtype=np.float32).reshape(-1), int(rate), format="wav")
    tokenized = tokenizer.encode_transcription(
        TranscriptionRequest(model=str(folder), audio=audio.to_base64("wav"), language=language)
    )
    return {
        "prompt_token_ids": list(tokenized.tokens),
        "multi_modal_data": {"audio": [(a.audio_array, a.sampling_rate) for a in tokenized.audios]},
    }


def check_language(language: Any) -> str | None:
    if language is None:
        return None  # the prompt names none: the model hears it
    if not isinstance(language, str) or language.lower() not in LANGUAGES:
        raise InvalidRequestError("language", f"{language!r} is not a language Voxtral knows ({', '.join(LANGUAGES)})")
    return language.lower()


def request_hook(folder: Path) -> Callable[[dict[str, Any], list[Any]], None]:
    """The family's request hook for one folder: a recogniser request becomes Voxtral's token prompt (in place);
    a request without ``transcription`` (an explicit prompt) passes as it is."""

    def to_transcription(prompt: dict[str, Any], params: list[Any]) -> None:
        if isinstance(params[0], dict):
            params[0].setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        info: Transcription | None = prompt.pop("transcription", None)
        if info is None:
            return
        mm = prompt.get("multi_modal_data")
        audio = mm.get("audio") if isinstance(mm, Mapping) else None
        if not (isinstance(audio, (tuple, list)) and len(audio) == 2 and isinstance(audio[1], int)):
            raise InvalidRequestError(
                "multi_modal_data.audio", "a Voxtral request needs the audio to transcribe, as (samples, rate)"
            )
        language = check_language(info.language)
        if info.task != "transcribe":
            raise InvalidRequestError("task", "Voxtral only transcribes")
        prompt.pop("prompt", None)  # (no previous text in Voxtral's request)
        prompt.update(transcription_prompt(folder, audio[0], audio[1], language))

    return to_transcription
