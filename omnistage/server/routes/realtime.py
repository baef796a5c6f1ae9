"""GET /v1/realtime?model=... (WebSocket): a conversation in OpenAI's Realtime event vocabulary (GA), as the
official client's ``client.realtime.connect(model=...)`` speaks it.

Turns are manual (the client commits) or found by server VAD. The conversation is kept as chat turns
(realtime/session.py) and each response is one /v1/chat/completions (or, for a speech model,
/v1/audio/speech) request, streamed as text / transcript and PCM16 audio deltas (realtime/connection.py).
``response.cancel``, a barge-in and a disconnect abort the request in every stage, as the HTTP routes do when
their client leaves. This module: the handshake (API key, model, session limit) and the session's start.
"""

from __future__ import annotations

import hmac
import json

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from omnistage.modality import OutputModality
from omnistage.server.errors import APIError
from omnistage.server.realtime.audio import model_input_rate
from omnistage.server.realtime.connection import (
    GOING_AWAY,
    POLICY_VIOLATION,
    TRY_AGAIN_LATER,
    UNSUPPORTED,
    Connection,
)
from omnistage.server.realtime.duplex_socket import serve_duplex
from omnistage.server.realtime.protocol import ProtocolError
from omnistage.server.realtime.session import ModelInfo, Session, new_id
from omnistage.server.state import ServerState

router = APIRouter(prefix="/v1")


# A browser cannot set headers on a WebSocket: OpenAI's browser clients offer the key as a subprotocol
# ("realtime", "openai-insecure-api-key.<key>"); the server then has to pick "realtime" or the browser drops it.
KEY_PROTOCOL = "openai-insecure-api-key."


def _subprotocols(ws: WebSocket) -> list[str]:
    return [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def _authorized(ws: WebSocket, key: str | None) -> bool:
    if not key:
        return True
    scheme, _, token = ws.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":  # no header: a browser's subprotocol, if any
        token = next((p[len(KEY_PROTOCOL) :] for p in _subprotocols(ws) if p.startswith(KEY_PROTOCOL)), None)
        if token is None:
            return False
    return hmac.compare_digest(token.strip().encode(), key.encode())


def model_info(state: ServerState) -> ModelInfo:
    info = state.engine.pipeline.info
    speech = info.speaks
    speaks = _speaks(state)
    return ModelInfo(
        name=state.model_name,
        speaks=speaks,
        input_rate=model_input_rate(state.engine.model),
        output_rate=speech.sample_rate if speaks else None,
        voices=speech.voices,
        supports_speed=speech.supports_speed,
        chat=info.chat,
        writes_text=OutputModality.TEXT in state.engine.output_modalities,
    )


@router.websocket("/realtime")
async def realtime(ws: WebSocket, model: str | None = None, duplex: str | None = None) -> None:
    if duplex not in (None, "", "0", "false"):
        await duplex_session(ws, model)
        return
    state: ServerState = ws.app.state.omni
    await ws.accept(subprotocol="realtime" if "realtime" in _subprotocols(ws) else None)
    refusal = _refusal(state, ws, model)
    if refusal is not None:  # nothing was set up: say why, then close
        state.realtime.refused.labels(refusal[0].code).inc()
        await _refuse(ws, *refusal)
        return
    if not state.realtime.try_open():
        await _refuse(
            ws,
            ProtocolError(
                f"this server holds at most {state.realtime.limit} realtime sessions at once "
                "(--max-realtime-sessions); try again later",
                None,
                "session_limit_reached",
                type="server_error",
            ),
            TRY_AGAIN_LATER,
        )
        return
    session = Session(model_info(state), state.options.realtime_max_buffer_s, limits=state.media)
    conn = Connection(ws, state, session, None if model is None or state.is_base_model(model) else model)
    try:
        await conn.run()
    finally:
        await conn.close()
        state.realtime.close()


@router.websocket("/duplex")
async def duplex_session(ws: WebSocket, model: str | None = None) -> None:
    """Full duplex on a duplex model (Moshi): realtime/duplex.py."""
    state: ServerState = ws.app.state.omni
    full = state.duplex is not None and state.duplex.refusal()
    if full and _authorized(ws, state.options.api_key):  # refused before the upgrade: HTTP 429
        error = {"type": "rate_limit_error", "code": "rate_limit_exceeded", "message": full, "param": None}
        await ws.send_denial_response(JSONResponse({"error": error}, status_code=429))
        return
    await ws.accept(subprotocol="realtime" if "realtime" in _subprotocols(ws) else None)
    refusal = _refusal(state, ws, model, duplex=True)
    if refusal is not None:
        await _refuse(ws, *refusal)
        return
    if not hasattr(ws.app.state, "duplex_sessions"):
        ws.app.state.duplex_sessions = {}  # session id -> DuplexConnection, across sockets (resume)
    await serve_duplex(ws, state.duplex, ws.app.state.duplex_sessions, state.options)


async def _refuse(ws: WebSocket, error: ProtocolError, code: int) -> None:
    try:
        await ws.send_text(json.dumps({"type": "error", "event_id": new_id("event"), "error": error.error()}))
        await ws.close(code)
    except (WebSocketDisconnect, OSError, RuntimeError):  # the client did not wait for the answer
        pass


def _refusal(
    state: ServerState, ws: WebSocket, model: str | None, duplex: bool = False
) -> tuple[ProtocolError, int] | None:
    if not _authorized(ws, state.options.api_key):
        return ProtocolError(
            "missing or wrong API key (send 'Authorization: Bearer <key>')",
            None,
            "invalid_api_key",
            type="authentication_error",
        ), POLICY_VIOLATION
    if state.admission.closing:
        return ProtocolError("server is shutting down", None, "shutting_down", type="server_error"), GOING_AWAY
    try:
        state.check_model(model)
    except APIError as e:
        return ProtocolError(e.message, "model", e.code or "model_not_found"), POLICY_VIOLATION
    if duplex != state.engine.pipeline.info.duplex:
        what = "has no duplex sessions" if duplex else "is full duplex: connect with ?duplex=1 or to /v1/duplex"
        return ProtocolError(f"model {state.model_name!r} {what}", "model", "unsupported_model"), UNSUPPORTED
    if duplex:
        return None  # a duplex model converses in frames, not turns
    writes_chat = state.engine.pipeline.info.chat and OutputModality.TEXT in state.engine.output_modalities
    if not (_speaks(state) or writes_chat):  # a conversation needs a speech model or a chat model's text
        return ProtocolError(
            f"model {state.model_name!r} cannot hold a conversation: it neither speaks (no speech declared, "
            f"produces {state.engine.output_modalities}) nor answers chat turns in text",
            "model",
            "unsupported_model",
        ), UNSUPPORTED
    return None


def _speaks(state: ServerState) -> bool:
    """A speech model: it declares ``PipelineInfo.speech`` and produces audio (a text-to-audio model does not)."""
    return state.engine.pipeline.info.speech is not None and OutputModality.AUDIO in state.engine.output_modalities
