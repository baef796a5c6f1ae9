"""Chat turns for a speech family: ``/v1/chat/completions`` (``modalities: ["audio"]``) and offline ``Omni``
with ``{"messages": [...]}`` speak the last user message's text, as ``/v1/audio/speech`` speaks ``input``.

A request hook (the pipeline's ``shape_request``): it runs for every request before the stages see it, so the
HTTP route and offline callers share it and the talker keeps one input, ``prompt``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omnistage.errors import InvalidRequestError

TEXT_PARTS = ("text", "input_text")


def _text_of(message: Mapping[str, Any], i: int) -> str | None:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"messages[{i}].content", "expected a string or a list of parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in TEXT_PARTS:  # a TTS model hears no images or audio: say so rather than drop them
            raise InvalidRequestError(
                f"messages[{i}].content[{j}]", f"this speech model speaks text; a {kind!r} part is not taken"
            )
        texts.append(part.get("text") or "")
    return "\n".join(texts)


def speak_last_user_message(prompt: dict[str, Any]) -> None:
    """``messages`` -> ``prompt`` (the last user message's text); the chat template's kwargs are dropped (no
    template is applied: the family builds its own prompt around the text)."""
    messages = prompt.pop("messages", None)
    prompt.pop("chat_template_kwargs", None)
    if messages is None:
        return
    if "prompt" in prompt:
        raise InvalidRequestError("messages", "give either 'prompt' or 'messages', not both")
    if not isinstance(messages, list):
        raise InvalidRequestError("messages", "expected a list of messages")
    last = None
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"messages[{i}]", "expected an object with role and content")
        if message.get("role") == "user":
            last = i
    text = _text_of(messages[last], last) if last is not None else None
    if not text or not text.strip():
        raise InvalidRequestError("messages", "the last user message has no text to speak")
    prompt["prompt"] = text
