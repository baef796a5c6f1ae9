"""How one chat request becomes the recogniser's request and, later, the chat model's conversation.

The request hook (``to_recognizer``) finds the single audio part of the last user message (``input_audio``
base64, or an ``audio_url`` ``data:`` URL, as the chat route passes them on), decodes it to Whisper's
16 kHz mono and turns the prompt into Whisper's explicit encoder-decoder prompt. The conversation
itself rides along as the prompt's ``conversation`` (the recogniser ignores it), so the edge to the
chat stage can put the transcript where the audio part was. Offline callers may also send a recogniser
request (``{"prompt": "", "multi_modal_data": {"audio": (samples, rate)}}``): the conversation is then the transcript alone.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import numpy as np

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.whisper.prompt import SAMPLE_RATE, WINDOW_S, to_encoder_decoder
from omnistage.speech import SpeechInput, Transcription

CONVERSATION_KEY = "conversation"
AUDIO_PARTS = ("input_audio", "audio_url")


def _audio_part(messages: list[Any]) -> tuple[int, int, dict[str, Any]]:
    """(message index, part index, part) of the last user message's one audio part."""
    users = [i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users:
        raise InvalidRequestError("messages", "speech_chat needs a user message with an audio part")
    i = users[-1]
    content = messages[i].get("content")
    found = [
        (j, p)
        for j, p in enumerate(content if isinstance(content, list) else [])
        if isinstance(p, Mapping) and p.get("type") in AUDIO_PARTS
    ]
    if len(found) != 1:
        raise InvalidRequestError(
            f"messages[{i}].content",
            "speech_chat needs exactly one audio part "
            f"(input_audio or audio_url) in the last user message, found {len(found)}",
        )
    return i, found[0][0], found[0][1]


def _part_bytes(part: Mapping[str, Any], field: str) -> bytes:
    if part["type"] == "input_audio":
        data = (part.get("input_audio") or {}).get("data")
        where = f"{field}.input_audio.data"
    else:
        url = (part.get("audio_url") or {}).get("url")
        where = f"{field}.audio_url.url"
        if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
            raise InvalidRequestError(where, "speech_chat takes the audio inline (a base64 data: URL)")
        data = url.split(",", 1)[1]
    if not isinstance(data, str):
        raise InvalidRequestError(where, "expected base64 audio")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(where, "not valid base64") from None


def _decode(data: bytes, field: str) -> np.ndarray:
    """Whisper's input: 16 kHz mono float32, at most one 30 s window (longer speech is refused, not cut)."""
    from omnistage.errors import APIError
    from omnistage.media.audio import decode_audio  # PyAV + the bounded decoder every entry point uses, lazily

    try:
        return decode_audio(data, field, SAMPLE_RATE, WINDOW_S)
    except APIError as e:  # the decoder's refusals carry an HTTP status; offline the same fault is the same 400
        where = e.param or field
        raise InvalidRequestError(where, e.message.removeprefix(f"{where}: ")) from None


def _resampled(audio: Any) -> np.ndarray:
    if not (isinstance(audio, (tuple, list)) and len(audio) == 2):
        raise InvalidRequestError("multi_modal_data.audio", "expected (samples, sample_rate)")
    from omnistage.media_intake import resample

    samples = resample(audio[0], int(audio[1]), SAMPLE_RATE)  # channels averaged, soxr HQ once (every input's)
    if samples.size > WINDOW_S * SAMPLE_RATE:
        raise InvalidRequestError("multi_modal_data.audio", f"speech_chat hears at most {WINDOW_S} s of audio")
    return samples


def to_recognizer(prompt: dict[str, Any], params: list[Any]) -> None:
    """The pipeline's request hook (in place): the chat request becomes the recogniser's request."""
    speech: SpeechInput | None = prompt.get("speech")
    messages = prompt.pop("messages", None)
    if messages is not None:
        if not isinstance(messages, list):
            raise InvalidRequestError("messages", "expected a list")
        i, j, part = _audio_part(messages)
        samples = _decode(_part_bytes(part, f"messages[{i}].content[{j}]"), f"messages[{i}].content[{j}]")
        if prompt.get("multi_modal_data"):
            raise InvalidRequestError("multi_modal_data", "with 'messages' the audio goes in the messages")
    else:
        samples = _resampled((prompt.get("multi_modal_data") or {}).get("audio"))
        messages = [{"role": "user", "content": [{"type": "input_audio"}]}]
    prompt.pop("prompt", None)
    language = (speech.language if speech is not None else None) or "en"
    recognizer = {
        "multi_modal_data": {"audio": (samples, SAMPLE_RATE)},
        "transcription": Transcription(language=language, task="transcribe"),
    }
    to_encoder_decoder(recognizer, params)  # Whisper's own hook: its prompt, its max_tokens default
    prompt.pop("multi_modal_data", None)
    prompt.update(recognizer)
    prompt[CONVERSATION_KEY] = messages


def transcript_into_messages(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """Edge recogniser -> chat: the conversation with the transcript where the audio part was."""
    transcript = (source.get("text") or "").strip()
    if not transcript:
        raise InvalidRequestError("messages", "the recogniser heard no words in the audio")
    messages = [dict(m) for m in request.prompt[CONVERSATION_KEY]]
    i, j, _ = _audio_part(messages)
    content = list(messages[i]["content"])
    content[j] = {"type": "text", "text": transcript}
    messages[i]["content"] = content
    out: dict[str, Any] = {"messages": messages}
    if request.prompt.get("chat_template_kwargs") is not None:
        out["chat_template_kwargs"] = request.prompt["chat_template_kwargs"]
    return out


def reply_to_speech(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """Edge chat -> TTS: the reply text is what the speech LM speaks (in the request's voice, if any)."""
    reply = (source.get("text") or "").strip()
    if not reply:
        raise InvalidRequestError("messages", "the chat model's reply is empty: nothing to speak")
    speech = request.prompt.get("speech")
    voice = speech.voice if speech is not None else None
    return {"prompt": reply, **({"speech": SpeechInput(voice=voice)} if voice is not None else {})}
