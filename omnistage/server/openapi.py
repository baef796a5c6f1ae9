"""OpenAPI entries for the responses that are not JSON (audio, video, server-sent events), so the
document says what a client really gets back (and schema-driven fuzzers can check it)."""

from __future__ import annotations

from typing import Any

_BINARY = {"type": "string", "format": "binary"}
# one server-sent event: ``data`` is a JSON chunk (or ``[DONE]``), errors after the start arrive as events too
_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
SSE = "text/event-stream"


def success(description: str, *media_types: str, json: bool = False) -> dict[int | str, dict[str, Any]]:
    """The 200 response of a route answering with ``media_types`` (byte bodies; SSE as text). With
    ``json`` the route's own JSON model stays documented beside them (e.g. chat: JSON or SSE)."""
    content = {m: {"schema": _EVENT if m == SSE else _BINARY} for m in media_types}
    entry: dict[str, Any] = {"content": content}
    if not json:
        entry["description"] = description
    return {200: entry}


def request_body(model: Any, files: dict[str, bool], json_body: bool = True) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads its body itself (JSON or multipart): ``model``'s fields, plus in
    the multipart form the file parts ``files`` names (True: several files allowed)."""
    fields = _inline(model.model_json_schema())
    form = {**fields, "properties": {**fields.get("properties", {})}}
    for name, many in files.items():
        form["properties"][name] = {"type": "array", "items": _BINARY} if many else _BINARY
    content = {"multipart/form-data": {"schema": form}}
    if json_body:
        content["application/json"] = {"schema": fields}
    return {"requestBody": {"required": True, "content": content}}


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its ``$defs`` references written in place (an operation's inline body
    schema cannot point into ``$defs``; these models are not recursive)."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk(dict(defs[ref.rsplit("/", 1)[1]]))
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)
