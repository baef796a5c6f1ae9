"""A realtime session's or response's ``extra_body``: fields of the HTTP body the response runs as, typed as
that route types them."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from omnistage.server.errors import describe_validation
from omnistage.server.protocol import ChatCompletionRequest, SpeechRequest
from omnistage.server.realtime.protocol import ProtocolError

# body fields the session itself sets: not for extra_body
OWNED = frozenset(
    {
        "messages",
        "model",
        "stream",
        "stream_options",
        "modalities",
        "audio",
        "n",
        "input",
        "voice",
        "response_format",
        "stream_format",
    }
)


def check_extra_body(
    extra: dict[str, Any], param: str, event_id: str | None, body: type[ChatCompletionRequest] | type[SpeechRequest]
) -> dict[str, Any]:
    """Fields of the HTTP body a response runs as, typed as that route types them (errors name
    ``param``.<field>)."""
    owned = sorted(OWNED & extra.keys())
    if owned:
        raise ProtocolError(
            f"{param}.{owned[0]}: set by the session, not by extra_body",
            f"{param}.{owned[0]}",
            "invalid_value",
            event_id,
        )
    required = {"messages": [{"role": "user", "content": "x"}]} if body is ChatCompletionRequest else {"input": "x"}
    try:
        body.model_validate({**extra, **required})
    except ValidationError as e:
        message, field_name = describe_validation(list(e.errors()))
        where = f"{param}.{field_name}" if field_name else param
        raise ProtocolError(
            f"{param}.{message}" if field_name else f"{param}: {message}", where, "invalid_value", event_id
        ) from None
    return dict(extra)
