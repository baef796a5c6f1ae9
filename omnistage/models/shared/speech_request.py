"""The checks every speech family runs first on a request: the text to speak and the preset voice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.speech import SpeechInput


def text_to_speak(text: Any) -> str:
    """The prompt's text; a missing or blank one is a 400 naming ``prompt``."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequestError("prompt", "the text to speak is empty")
    return text


def preset_voice(speech: SpeechInput | None, voices: Sequence[str], otherwise: str) -> SpeechInput:
    """The request's speech fields (empty when it sent none), its ``voice`` one of ``voices`` when named
    (``otherwise`` says how to get a voice the model lacks)."""
    info = speech or SpeechInput()
    if info.voice is not None and info.voice not in voices:
        raise InvalidRequestError(
            "voice", f"{info.voice!r} is not one of this model's voices ({', '.join(voices)}); {otherwise}"
        )
    return info
