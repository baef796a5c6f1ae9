"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can cause maps to a 4xx naming the field; only genuine
internal faults become 500 (and never leak a traceback to the client).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from omnistage.errors import (
    InvalidRequestError,
    StageFailedError,
    StageUnavailableError,
)

logger = logging.getLogger(__name__)

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

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_engine_error(err: BaseException) -> APIError:
    """Map an exception raised while running a request to the client's error."""
    if isinstance(err, APIError):
        return err
    if isinstance(err, InvalidRequestError):
        return APIError(400, str(err), param=err.field)
    if isinstance(err, StageUnavailableError):
        return APIError(503, str(err), code="stage_unavailable", headers={"Retry-After": "5"})
    if isinstance(err, StageFailedError):
        return APIError(500, str(err), code="stage_failed")
    logger.error("internal error", exc_info=err)
    return APIError(500, f"internal error: {type(err).__name__}", code="internal_error")


# --------------------------------------------------------------------------- OpenAPI


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the errors a route really answers (all in OpenAI's shape)."""
    why = {
        400: "Invalid request (``param`` names the field)",
        401: "Missing or wrong API key",
        404: "Unknown model, job or file",
        409: "The job is not finished",
        413: "Upload or body too large",
        415: "Unsupported content type",
        429: "Rate limited",
        500: "Internal fault (this request only)",
        503: "Saturated, shutting down or a stage restarting (see Retry-After)",
        504: "Not finished within the server's --request-timeout",
    }
    return {s: {"model": ErrorResponse, "description": why[s]} for s in statuses}


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "bytes"}


def _is_field(p: Any) -> bool:
    """Loc entries are field names and indices; union members add type tags ('str', 'list[...]', 'URLRef')."""
    if isinstance(p, int):
        return True
    return (
        p.isidentifier() and p not in _TYPE_TAGS and not p[:1].isupper() and p not in ("body", "query", "path", "form")
    )


def _loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if _is_field(p)]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


def describe_validation(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for pydantic / FastAPI validation errors."""
    msgs, first = [], None
    for e in errors:
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx") or {}
            return f"request body is not valid JSON: {ctx.get('error', 'decode error')}", None
        field = _loc(tuple(e.get("loc", ())))
        first = first or field or None
        msg = e.get("msg", "invalid value")
        if e.get("type") == "extra_forbidden":
            msg = "unknown field"
        if e.get("type") == "missing":
            msg = "field required"
        msgs.append(f"{field}: {msg}" if field else msg)
    return "; ".join(msgs) or "invalid request", first


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation(list(exc.errors()))
        return APIError(400, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return APIError(exc.status_code, message, headers=getattr(exc, "headers", None)).response()

    @app.exception_handler(InvalidRequestError)
    async def _invalid(request: Request, exc: InvalidRequestError) -> JSONResponse:
        return from_engine_error(exc).response()

    @app.exception_handler(StageFailedError)
    async def _stage_failed(request: Request, exc: StageFailedError) -> JSONResponse:
        return from_engine_error(exc).response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return from_engine_error(exc).response()
