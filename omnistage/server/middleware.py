"""Pure ASGI middleware (no BaseHTTPMiddleware: it breaks disconnect detection
and streaming): request ids + access log + latency metrics, a request body
size cap that answers 413 without reading an oversized body, and a nesting-depth
cap on JSON bodies checked before anything parses them."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException

from omnistage.media.json_depth import MAX_JSON_DEPTH, check_json_depth
from omnistage.server.errors import APIError, error_response

logger = logging.getLogger("omnistage.server")
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,96}$")


def request_id(scope: dict[str, Any]) -> str:
    return scope.get("state", {}).get("request_id") or uuid.uuid4().hex


class RequestContext:
    """Give every request an id (a sane client ``X-Request-Id`` is kept), echo it in
    the response headers and log one line per request."""

    def __init__(self, app: Any, metrics: Any):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _ID.match(given) else f"req-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = rid
        start = time.monotonic()
        status = {"code": 500}

        async def send_with_id(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers") or [])
                headers.append((b"x-request-id", rid.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            elapsed = time.monotonic() - start
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(path, str(status["code"])).inc()
            if path not in ("/metrics", "/health", "unmatched"):
                self.metrics.latency.labels(path).observe(elapsed)
            logger.info("%s %s %s -> %d in %.3fs", rid, scope.get("method"), scope.get("path"), status["code"], elapsed)


class BodySizeLimit:
    def __init__(self, app: Any, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._reject(send, int(length))
        seen = 0
        started = False

        async def counting_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(send, seen)

    async def _reject(self, send: Any, size: int) -> None:
        err = APIError(
            413, f"request body of {size}+ bytes exceeds the limit of {self.max_bytes} bytes", code="payload_too_large"
        )
        body = json.dumps(err.body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class JsonDepthLimit:
    """A JSON body (or one without a content type, which FastAPI parses as JSON) nested deeper than
    ``max_depth`` is a 400 naming its top-level field, before the stdlib parser recurses into it (it raises
    ``RecursionError`` near 1000 levels, and shallower nesting still overflows the stack later, in copies)."""

    def __init__(self, app: Any, max_depth: int = MAX_JSON_DEPTH):
        self.app = app
        self.max_depth = max_depth

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        ctype = dict(scope.get("headers") or []).get(b"content-type", b"").split(b";")[0].strip().lower()
        if ctype and b"json" not in ctype:  # multipart and forms: their JSON fields are checked where parsed
            return await self.app(scope, receive, send)
        chunks, message = [], {"type": "http.request", "body": b"", "more_body": True}
        while message["type"] == "http.request" and message.get("more_body"):
            message = await receive()  # (BodySizeLimit, outside, still counts these)
            chunks.append(message.get("body", b""))
        body = b"".join(chunks)
        try:
            check_json_depth(body, self.max_depth)
        except APIError as err:
            return await error_response(err)(scope, receive, send)
        replay = (
            [{"type": "http.request", "body": body, "more_body": False}]
            if message["type"] == "http.request"
            else [message]
        )  # a disconnect while the body came: passed on as it was

        async def replayed() -> dict:
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)


class _TooLarge(StarletteHTTPException):
    # An HTTPException so that body parsers re-raise it instead of calling it a parse error.
    def __init__(self, limit: int):
        super().__init__(413, f"request body exceeds the limit of {limit} bytes")
