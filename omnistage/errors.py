"""Errors that cross component boundaries, typed so nobody parses messages.

``InvalidRequestError`` is the caller's fault (HTTP 400) and names the request field it is
about; engines raise it while validating, the orchestrator passes it on, and
the server maps it to OpenAI's error shape with ``param`` set to the field.
``StageFailedError`` is a stage failing one request (HTTP 500 for that request
only); ``StageUnavailableError`` a stage that cannot take requests right now
(its process died and is being restarted: HTTP 503).
"""

from __future__ import annotations

from typing import Any


class InvalidRequestError(ValueError):
    """The caller sent something invalid; ``field`` names it (``None`` when no single field is at fault)."""

    def __init__(self, field: str | None, message: str, context: str = ""):
        super().__init__(field, message, context)
        self.field = field
        self.message = message
        self.context = context  # where it happened, e.g. "stage 1 (dit): "

    def __str__(self) -> str:
        return self.context + (f"{self.field}: {self.message}" if self.field else self.message)

    def within(self, context: str) -> InvalidRequestError:
        return InvalidRequestError(self.field, self.message, context + self.context)


class StageFailedError(RuntimeError):
    """A stage failed this request (other requests are unaffected)."""


class StageUnavailableError(StageFailedError):
    """The stage cannot serve requests right now (e.g. its process died and is restarting)."""


# OpenAI's error types by HTTP status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_overloaded",
}


class APIError(Exception):
    """A refusal with its HTTP status (400, 413, 415, ...) and OpenAI's error fields; raised where the status is
    decided (media decoding, the routes) and rendered by the server."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)
