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

from omnistage.errors import (  # APIError and bad_request live below the server so media decoding can raise them
    APIError,
    InvalidRequestError,
    StageFailedError,
    StageUnavailableError,
    bad_request,  # noqa: F401 - re-exported: the routes raise it from here
)

logger = logging.getLogger(__name__)


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


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
        416: "Range outside the file",
        429: "Rate limited",
        500: "Internal fault (this request only)",
        503: "Saturated, shutting down, a stage restarting or a job/media store unreachable (see Retry-After)",
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
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation(list(exc.errors()))
        return error_response(APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return error_response(APIError(exc.status_code, message, headers=getattr(exc, "headers", None)))

    @app.exception_handler(InvalidRequestError)
    async def _invalid(request: Request, exc: InvalidRequestError) -> JSONResponse:
        return error_response(from_engine_error(exc))

    @app.exception_handler(StageFailedError)
    async def _stage_failed(request: Request, exc: StageFailedError) -> JSONResponse:
        return error_response(from_engine_error(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return error_response(from_engine_error(exc))
