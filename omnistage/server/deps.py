"""FastAPI dependencies every router uses: the server state and the API-key check."""

from __future__ import annotations

import hmac

from fastapi import Request

from omnistage.server.errors import APIError
from omnistage.server.state import ServerState


# async: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop for every request
async def get_state(request: Request) -> ServerState:
    return request.app.state.omni


async def require_api_key(request: Request) -> None:
    key = request.app.state.omni.options.api_key
    if not key:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(
            401,
            "missing or wrong API key (send 'Authorization: Bearer <key>')",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
