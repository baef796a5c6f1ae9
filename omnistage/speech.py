"""The typed speech parts of a request: what to speak with (``SpeechInput``) and how to recognise speech
(``Transcription``).

Both are prompt keys (``{"prompt": "hello", "speech": SpeechInput(voice="Vivian")}``), built by the HTTP routes
and by offline callers, checked once at admission (``check_speech`` / ``check_transcription``: a wrong-typed field
is an ``InvalidRequestError`` naming it) and read by the families. ``SpeechInput`` crosses stage processes as a
typed field of the stage request, so a stage in another process reads the same object. The text to speak stays the
prompt's ``prompt``: every stage (a vLLM codec LM included) reads its text there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from omnistage.errors import InvalidRequestError

# A clip as (samples, sample rate): samples are a 1-D or (samples, channels) array-like, checked by the family
# that hears it (mono_clip), which also resamples it to its codec's rate.
Clip = tuple[Any, int]


class SpeechTurn(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An earlier turn of a conversation a model continues in voice (CSM): who spoke, what, and how it sounded."""

    speaker: str
    text: str
    audio: Clip | None = None


class SpeechInput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """How to speak a request's text. ``voice`` is one of the model's preset voices; a cloned voice is
    ``ref_audio`` (its clip) with ``ref_text`` (the clip's transcript). Unset fields keep the family's default."""

    voice: str | None = None
    ref_audio: Clip | None = None
    ref_text: str | None = None
    instructions: str | None = None  # a style or scene description, for the families that take one
    language: str | None = None
    speed: float | None = None
    context: tuple[SpeechTurn, ...] | None = None  # earlier turns the model continues from (CSM)
    x_vector_only_mode: bool | None = None  # Qwen3-TTS Base: clone from the speaker embedding alone
    non_streaming_mode: bool | None = None  # Qwen3-TTS: the whole text in the prompt instead of fed per step
    enable_text_splitting: bool | None = None  # XTTS: speak the text sentence by sentence (its release's option)
    # the codec stage's chunk sizes in frames (codec-token pipelines): its first piece, and every later one
    initial_codec_chunk_frames: int | None = None
    chunk_frames: int | None = None


class Transcription(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """What a recogniser request asks of the audio in ``multi_modal_data.audio``: its language (None: the
    model's own choice or default), transcribe or translate, timestamps per segment, or the spoken language
    itself (Whisper's language probe)."""

    language: str | None = None
    task: str = "transcribe"
    timestamps: bool = False
    detect_language: bool = False


T = TypeVar("T", bound=msgspec.Struct)


def _typed(value: Any, cls: type[T], key: str) -> T:
    """``value`` (an instance or a mapping of its fields) as a checked ``cls``; a wrong-typed field is a 400
    naming it. A struct's constructor does not check types, so an instance is checked field by field too."""
    if isinstance(value, cls):
        fields = msgspec.structs.asdict(value)
    elif isinstance(value, Mapping):
        fields = dict(value)
    else:
        raise InvalidRequestError(key, f"expected a {cls.__name__}, got {type(value).__name__}")
    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as e:
        raise InvalidRequestError(_field(str(e), key), str(e).split(" - at `$", 1)[0]) from None


def _field(message: str, key: str) -> str:
    """The field a msgspec validation message names (``... - at `$.context[0].text` `` -> ``context[0].text``;
    an unknown field ``foo`` -> ``foo``)."""
    unknown = re.match(r"Object contains unknown field `([^`]+)`(?: - at `\$\.?([^`]*)`)?", message)
    if unknown:
        return ".".join(p for p in (unknown[2], unknown[1]) if p)
    at = re.search(r" - at `\$\.([^`]+)`$", message)
    return at[1] if at else key


def check_speech(value: Any) -> SpeechInput:
    return _typed(value, SpeechInput, "speech")


def check_transcription(value: Any) -> Transcription:
    return _typed(value, Transcription, "transcription")
