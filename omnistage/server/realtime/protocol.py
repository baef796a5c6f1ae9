"""Client events of the OpenAI Realtime protocol (GA) that /v1/realtime takes, as pydantic models, and the
parsing of one WebSocket frame into one of them.

Every field a client sends is typed: a frame that is not JSON, names an unknown event, carries a wrong type
or is too large becomes a ``ProtocolError`` naming the event and the field, which the route answers with an
``error`` event while the session goes on. OpenAI fields this server does not act on (tools, tracing, ...)
are accepted and ignored when unset; the few that would change the answer are refused where the session
applies them (session.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from omnistage.media import audio_decode
from omnistage.media.json_depth import MAX_JSON_DEPTH, json_too_deep
from omnistage.server.errors import APIError, describe_validation

MAX_ID = 64  # OpenAI's limit on client-chosen ids


class ProtocolError(Exception):
    """A client event the server cannot take; becomes an ``error`` server event."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str = "invalid_request_error",
        event_id: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message, self.param, self.code, self.event_id, self.type = message, param, code, event_id, type

    def error(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "event_id": self.event_id,
        }


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI fields omnistage does not use yet


Id = Annotated[str, Field(min_length=1, max_length=MAX_ID)]


class AudioFormat(_Model):
    type: Literal["audio/pcm"] = "audio/pcm"  # PCM16 little-endian mono (G.711 pcmu/pcma: not yet)
    rate: int | None = Field(None, ge=8000, le=192000)


class TurnDetection(_Model):
    type: Literal["server_vad", "semantic_vad"]
    threshold: float | None = Field(None, ge=0.0, le=1.0)
    prefix_padding_ms: int | None = Field(None, ge=0)
    silence_duration_ms: int | None = Field(None, ge=0)
    create_response: bool | None = None
    interrupt_response: bool | None = None
    idle_timeout_ms: int | None = Field(None, ge=0)


class AudioInput(_Model):
    format: AudioFormat | None = None
    turn_detection: TurnDetection | None = None
    transcription: dict[str, Any] | None = None
    noise_reduction: dict[str, Any] | None = None


class VoiceId(_Model):
    id: str


class AudioOutput(_Model):
    format: AudioFormat | None = None
    voice: str | VoiceId | None = None
    speed: float | None = Field(None, ge=0.25, le=1.5)


class AudioConfig(_Model):
    input: AudioInput | None = None
    output: AudioOutput | None = None


MaxTokens = Annotated[int, Field(ge=1)] | Literal["inf"]
Modalities = Annotated[list[Literal["text", "audio"]], Field(min_length=1, max_length=1)]


class SessionParams(_Model):
    type: Literal["realtime"] = "realtime"
    model: str | None = None
    instructions: str | None = None
    output_modalities: Modalities | None = None
    audio: AudioConfig | None = None
    max_output_tokens: MaxTokens | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # omnistage: fields of a /v1/chat/completions body (temperature, seed, sampling_params_list, ...)
    extra_body: dict[str, Any] | None = None


class ContentPart(_Model):
    type: Literal["input_text", "input_audio", "input_image", "text", "output_text", "output_audio"]
    text: str | None = None
    audio: str | None = None  # base64 PCM16 at the session's input rate (input_audio)
    transcript: str | None = None


class Item(_Model):
    id: Id | None = None
    type: Literal["message", "function_call", "function_call_output"] = "message"
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentPart] = Field(default_factory=list)
    status: str | None = None


class ResponseAudio(_Model):
    output: AudioOutput | None = None


class ResponseParams(_Model):
    output_modalities: Modalities | None = None
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    audio: ResponseAudio | None = None
    conversation: str | None = None  # "auto" (the default) or "none"
    input: list[Item] | None = None
    metadata: dict[str, str] | None = None
    extra_body: dict[str, Any] | None = None


class _Event(_Model):
    event_id: Id | None = None


class SessionUpdate(_Event):
    type: Literal["session.update"]
    session: SessionParams


class AudioAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class AudioCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class AudioClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ItemCreate(_Event):
    type: Literal["conversation.item.create"]
    item: Item
    previous_item_id: Id | None = None


class ItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: Id


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseParams | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: Id | None = None


ClientEvent = (
    SessionUpdate | AudioAppend | AudioCommit | AudioClear | ItemCreate | ItemDelete | ResponseCreate | ResponseCancel
)
EVENTS: dict[str, TypeAdapter[Any]] = {
    m.model_fields["type"].annotation.__args__[0]: TypeAdapter(m)  # type: ignore[union-attr]
    for m in (
        SessionUpdate,
        AudioAppend,
        AudioCommit,
        AudioClear,
        ItemCreate,
        ItemDelete,
        ResponseCreate,
        ResponseCancel,
    )
}
# OpenAI client events this server knows but does not serve yet: said so, not "unknown"
NOT_YET = {"conversation.item.retrieve", "conversation.item.truncate", "output_audio_buffer.clear"}


def parse(frame: str | bytes, max_bytes: int) -> ClientEvent:
    """One WebSocket frame -> one client event, or ``ProtocolError``."""
    if len(frame) > max_bytes:
        raise ProtocolError(
            f"event is {len(frame)} bytes, larger than this server's limit of {max_bytes}", code="event_too_large"
        )
    key = json_too_deep(frame)
    if key is not None:
        raise ProtocolError(
            f"{key or 'event'}: JSON nested more than {MAX_JSON_DEPTH} levels deep", key or None, "json_too_deep"
        )
    try:
        raw = json.loads(frame)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"event is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(raw, dict):
        raise ProtocolError("event must be a JSON object", code="invalid_event")
    event_id = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("type: field required (a string naming the event)", "type", "invalid_event", event_id)
    if kind in NOT_YET:
        raise ProtocolError(
            f"type: {kind!r} is not supported by this server yet", "type", "unsupported_event", event_id
        )
    adapter = EVENTS.get(kind)
    if adapter is None:
        raise ProtocolError(
            f"type: unknown client event {kind!r} (one of {', '.join(EVENTS)})", "type", "invalid_event_type", event_id
        )
    try:
        return adapter.validate_python(raw)
    except ValidationError as e:
        message, param = describe_validation(list(e.errors()))
        raise ProtocolError(message, param, "invalid_value", event_id) from None


def decode_pcm16(data: str, field: str, event_id: str | None, max_bytes: int) -> bytes:
    """Base64 PCM16, decoded by the shared decode-limits module (bounded by ``max_bytes`` before decoding)."""
    try:
        return audio_decode.decode_pcm16(data, field, max_bytes)
    except APIError as e:
        raise ProtocolError(e.message, e.param, e.code or "invalid_value", event_id) from None
