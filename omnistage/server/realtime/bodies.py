"""The HTTP body each realtime response runs as: /v1/chat/completions' for chat models (the session's
conversation as messages), /v1/audio/speech's for speech models (the last user text), with the session's and
the response's knobs; ``extra_body`` fields are typed as those routes type them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from omnistage.server.errors import describe_validation
from omnistage.server.protocol import ChatCompletionRequest, SpeechRequest
from omnistage.server.realtime.extra_body import check_extra_body
from omnistage.server.realtime.protocol import ProtocolError, ResponseParams

if TYPE_CHECKING:
    from omnistage.server.realtime.session import ConversationItem, Session


def speech_body(session: Session, params: ResponseParams | None, event_id: str | None) -> SpeechRequest:
    """For a speech model: /v1/audio/speech's body speaking the last user item's text."""
    params = params or ResponseParams()
    items = (
        session.items
        if params.input is None
        else [session.item_from(it, f"response.input[{i}]", event_id) for i, it in enumerate(params.input)]
    )
    text = _speech_text(items)
    if text is None:
        raise ProtocolError(
            "the last user item has no text to speak (this model speaks text: input_text)",
            None,
            "conversation_empty",
            event_id,
        )
    if params.output_modalities is not None:
        session.check_modalities(params.output_modalities, "response.output_modalities", event_id)
    extra = dict(session.extra_body)
    if params.extra_body is not None:
        extra.update(check_extra_body(params.extra_body, "response.extra_body", event_id, SpeechRequest))
    body: dict[str, Any] = {**extra, "model": None, "input": text, "response_format": "pcm"}
    out = params.audio.output if params.audio is not None else None
    voice = (
        session.check_voice(out.voice, "response.audio.output.voice", event_id)
        if (out is not None and out.voice is not None)
        else session.voice
    )
    if voice is not None:
        body["voice"] = voice
    instructions = session.instructions if params.instructions is None else params.instructions
    if instructions:
        body["instructions"] = instructions
    limit = session.max_output_tokens if params.max_output_tokens is None else params.max_output_tokens
    if limit != "inf":
        body["max_new_tokens"] = limit
    if session.speed != 1.0:
        body["speed"] = session.speed
    try:
        return SpeechRequest.model_validate(body)
    except ValidationError as e:
        message, param = describe_validation(list(e.errors()))
        raise ProtocolError(message, param, "invalid_value", event_id) from None


def chat_body(session: Session, params: ResponseParams | None, event_id: str | None) -> ChatCompletionRequest:
    """The /v1/chat/completions body this response runs as: instructions + the conversation (or the
    response's own ``input``), the session's knobs under the response's overrides."""
    params = params or ResponseParams()
    if params.conversation not in (None, "auto", "none"):
        raise ProtocolError(
            "response.conversation: 'auto' or 'none'", "response.conversation", "invalid_value", event_id
        )
    items = session.items
    if params.input is not None:
        items = [session.item_from(it, f"response.input[{i}]", event_id) for i, it in enumerate(params.input)]
    instructions = session.instructions if params.instructions is None else params.instructions
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + [it.message() for it in items]
    if not any(m["role"] == "user" for m in messages):
        raise ProtocolError("the conversation has no user item to respond to", None, "conversation_empty", event_id)
    modalities = (
        session.output_modalities
        if params.output_modalities is None
        else session.check_modalities(params.output_modalities, "response.output_modalities", event_id)
    )
    extra = dict(session.extra_body)
    if params.extra_body is not None:
        extra.update(check_extra_body(params.extra_body, "response.extra_body", event_id, ChatCompletionRequest))
    body: dict[str, Any] = {
        **extra,
        "model": None,
        "messages": messages,
        "modalities": ["text", "audio"] if modalities == ["audio"] else ["text"],
    }
    voice = session.voice
    out = params.audio.output if params.audio is not None else None
    if out is not None and out.voice is not None:
        voice = session.check_voice(out.voice, "response.audio.output.voice", event_id)
    if voice is not None and modalities == ["audio"]:
        body["audio"] = {"voice": voice, "format": "pcm16"}
    limit = session.max_output_tokens if params.max_output_tokens is None else params.max_output_tokens
    if limit != "inf":
        body["max_tokens"] = limit
    if not session.info.speaks:
        body.pop("modalities")  # a text model's chat route picks its own (text) output
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        message, param = describe_validation(list(e.errors()))
        raise ProtocolError(message, param, "invalid_value", event_id) from None


def _speech_text(items: list[ConversationItem]) -> str | None:
    for item in reversed(items):
        if item.role == "user":
            text = " ".join(p["text"] for p in item.parts if p["type"] == "text").strip()
            return text or None
    return None
