"""One duplex WebSocket's event loop (the protocol: ``realtime/duplex.py``): client events in order; the session's
frames are sent beside them by its ``DuplexConnection``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omnistage.errors import InvalidRequestError
from omnistage.server.realtime.duplex import (
    CHUNK_PERIOD_MS,
    SAMPLE_RATE,
    DuplexConnection,
    decode_append,
    error_event,
    session_params,
)
from omnistage.server.realtime.duplex_admission import CapacityError, DuplexAdmission

CLOSE_WAIT_S = 60.0  # session.close: the frames already sent are stepped and sent before the socket closes


def capabilities(grace_s: float) -> dict[str, Any]:
    return {
        "chunk_period_ms": CHUNK_PERIOD_MS,
        "supports_session_resume": True,
        "resume_grace_s": grace_s,
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
    }


async def serve_duplex(
    ws: WebSocket, admission: DuplexAdmission, registry: dict[str, DuplexConnection], options: Any
) -> None:
    conn: DuplexConnection | None = None
    try:
        while True:
            try:
                text = await ws.receive_text()
            except (WebSocketDisconnect, RuntimeError):
                return
            try:
                event = json.loads(text)
                kind = event["type"]
                if not isinstance(kind, str):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                await error_event(conn, ws, "type", "expected a JSON object with a string 'type'", "invalid_event")
                continue
            try:
                conn, done = await handle(conn, ws, kind, event, admission, registry, options)
            except InvalidRequestError as e:
                await error_event(conn, ws, e.field, e.message, "invalid_value")
                continue
            if done:
                return
    finally:
        if conn is not None:
            conn.detach(ws)


async def handle(
    conn: DuplexConnection | None,
    ws: WebSocket,
    kind: str,
    event: dict,
    admission: DuplexAdmission,
    registry: dict,
    options: Any,
) -> tuple[DuplexConnection | None, bool]:
    """One client event; (the connection, whether the socket is done)."""
    if kind == "session.update":
        if conn is not None:
            raise InvalidRequestError("session", "the session's parameters are set by its first session.update")
        params = session_params(event)
        try:
            session = await admission.open(params)
        except CapacityError as e:
            await error_event(None, ws, None, str(e), "rate_limit_exceeded", "rate_limit_error")
            return None, False
        grace_s = options.duplex_resume_grace_s
        conn = DuplexConnection(session, registry, grace_s)
        conn.ws = ws
        info = {"id": conn.id, "resume_token": conn.token, "capabilities": capabilities(grace_s)}
        await conn.emit("session.created", session=info)
        return conn, False
    if kind == "session.resume":
        return await resume(conn, ws, event, registry), False
    if conn is None:
        raise InvalidRequestError("type", f"{kind!r} before session.update (or session.resume)")
    if kind == "input_audio_buffer.append":
        await conn.session.send(decode_append(event))
    elif kind == "session.event_ack":
        conn.ack(sequence(event))
    elif kind == "session.heartbeat":
        await conn.emit("session.heartbeat")
    elif kind == "playback.ack":
        pass  # the client's playback position: nothing is paced by it
    elif kind == "session.close":
        await conn.session.close()
        await asyncio.wait_for(conn.closed.wait(), CLOSE_WAIT_S)
        await ws.close(1000)
        return conn, True
    else:
        raise InvalidRequestError("type", f"unknown event {kind!r}")
    return conn, False


def sequence(event: dict) -> int:
    seq = event.get("last_event_seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise InvalidRequestError("last_event_seq", f"expected a non-negative integer, got {seq!r}")
    return seq


async def resume(conn: DuplexConnection | None, ws: WebSocket, event: dict, registry: dict) -> DuplexConnection:
    if conn is not None:
        raise InvalidRequestError("session_id", "this socket already holds a session")
    target = registry.get(str(event.get("session_id")))
    if target is None or target.token != event.get("resume_token"):
        raise InvalidRequestError("resume_token", "no paused session with that id and token (expired or wrong)")
    if target.ws is not None:
        raise InvalidRequestError("session_id", "that session is attached to another socket")
    after = sequence(event)
    resumed = {"type": "session.resumed", "server_event_seq": target.seq, "session": {"id": target.id}}
    await ws.send_text(json.dumps(resumed))  # numbered as the last event so far: the replay follows it
    await target.resume_on(ws, after)
    return target
