"""GET /api/chat (WebSocket) on a full-duplex model (Moshi): ``moshi.server``'s own protocol
(realtime/duplex_moshi.py), so ``python -m moshi.client`` and the authors' web UI work against omnistage.

Everything that can be refused is refused before the upgrade, as an HTTP error the authors' clients report: a
missing or wrong API key (401; the key as ``Authorization: Bearer KEY``, or as the password of Basic auth, which
``moshi.client --url ws://moshi:KEY@host:port`` sends), a model without duplex sessions (400), a bad query field
(400 naming it), no real-time capacity left (429, as ``/v1/realtime?duplex=1`` refuses) and a server shutting
down (503). The session is opened before the upgrade too, so a session that waits for a free slot waits there.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse

from omnistage.errors import InvalidRequestError
from omnistage.server.realtime.duplex_admission import CapacityError
from omnistage.server.realtime.duplex_moshi import MoshiChat, query_name, sampling_params
from omnistage.server.state import ServerState

router = APIRouter()


def authorized(ws: WebSocket, key: str | None) -> bool:
    if not key:
        return True
    scheme, _, token = ws.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "basic":  # user:password, the key as the password (any user name)
        try:
            token = base64.b64decode(token.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, ValueError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), key.encode())


async def deny(ws: WebSocket, status: int, kind: str, code: str, message: str, param: str | None = None) -> None:
    error = {"type": kind, "code": code, "message": message, "param": param}
    await ws.send_denial_response(JSONResponse({"error": error}, status_code=status))


@router.websocket("/api/chat")
async def moshi_chat(ws: WebSocket) -> None:
    state: ServerState = ws.app.state.omni
    if not authorized(ws, state.options.api_key):
        message = "missing or wrong API key (send 'Authorization: Bearer <key>', or the key as Basic auth's password)"
        return await deny(ws, 401, "authentication_error", "invalid_api_key", message)
    if state.admission.closing:
        return await deny(ws, 503, "server_error", "shutting_down", "server is shutting down")
    if not state.engine.pipeline.info.duplex:
        message = f"model {state.model_name!r} has no duplex sessions: /api/chat serves full-duplex models (Moshi)"
        return await deny(ws, 400, "invalid_request_error", "unsupported_model", message, "model")
    try:
        params = sampling_params(ws.query_params)
    except InvalidRequestError as e:
        return await deny(ws, 400, "invalid_request_error", "invalid_value", e.message, e.field)
    try:
        session = await state.duplex.open(params)
    except CapacityError as e:
        return await deny(ws, 429, "rate_limit_error", "rate_limit_exceeded", str(e))
    except InvalidRequestError as e:
        return await deny(ws, 400, "invalid_request_error", "invalid_value", e.message, query_name(e.field))
    try:
        await ws.accept()
    except BaseException:  # the client left while the session waited for its slot
        await session.abort()
        raise
    await MoshiChat(ws, session).run()
