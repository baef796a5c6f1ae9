"""The full-duplex WebSocket (``GET /v1/realtime?duplex=1`` and ``/v1/duplex``) on a duplex model (Moshi): audio
in and audio + transcript out at once, no turns, in OpenAI Realtime event names plus session lifetime.

Client events: ``session.update`` (first: opens the session with ``temperature``, ``top_k``,
``temperature_text``, ``top_k_text``, ``seed``, and a persona: ``voice`` with ``instructions``),
``input_audio_buffer.append`` (base64 PCM16 mono at 24 kHz),
``session.resume`` (``session_id``, ``resume_token``, ``last_event_seq``), ``session.event_ack``
(``last_event_seq``), ``session.heartbeat``, ``playback.ack``, ``session.close``. Server events:
``session.created`` (``session.id``, ``resume_token``, ``capabilities``), ``session.resumed``,
``response.output_audio.delta`` and the beta ``response.audio.delta`` (base64 PCM16 per 80 ms frame),
``response.output_audio_transcript.delta`` (each text token the model writes; ``token_ids`` beside the text),
``session.heartbeat``, ``session.closed``, ``error``. Every server event carries ``server_event_seq``.

Lifetime: a session outlives its socket. When the socket drops, the session is paused (no input reaches the
model, so it steps no further) and keeps its slot for ``--duplex-resume-grace`` seconds (30 by default); ``session.resume`` with its token on a new
socket replays every event after the sequence number the client acknowledges, then goes on, so a resumed
session's events equal an unbroken one's. Past the grace period the session is aborted and its slot freed.
Bad input (bad base64, an odd byte count, an oversized append, an unknown event) is an ``error`` event naming
what was wrong, and the session goes on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import secrets
from typing import Any

import numpy as np
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omnistage.errors import InvalidRequestError
from omnistage.server.media import b64, pcm16

MAX_APPEND_BYTES = 2 * 24000 * 10  # one append holds at most 10 s of PCM16 at 24 kHz
SAMPLE_RATE = 24000
CHUNK_PERIOD_MS = 80
TEXT_PADDING = (0, 3)  # Moshi's text-stream padding tokens: no transcript event for them
# sampling, and the persona (a voice preset and the text prompt, stepped before the session's first frame)
PARAMS = ("temperature", "top_k", "temperature_text", "top_k_text", "seed", "voice", "instructions")


def event_id() -> str:
    return "event_" + secrets.token_hex(8)


class DuplexConnection:
    """One duplex session's server side: its engine session, its numbered events (kept until acknowledged) and
    the socket currently attached (None while paused)."""

    def __init__(self, session: Any, registry: dict[str, DuplexConnection], grace_s: float):
        self.session, self.registry, self.grace_s = session, registry, grace_s
        self.id = session.id
        self.token = secrets.token_urlsafe(24)
        self.seq = 0
        self.unacked: list[tuple[int, str]] = []
        self.ws: WebSocket | None = None
        self.closed = asyncio.Event()
        self._expiry: asyncio.TimerHandle | None = None
        self._pump = asyncio.create_task(self._frames(), name=f"duplex-ws-{self.id}")
        registry[self.id] = self

    async def emit(self, kind: str, **fields: Any) -> None:
        self.seq += 1
        text = json.dumps({"type": kind, "event_id": event_id(), "server_event_seq": self.seq, **fields})
        self.unacked.append((self.seq, text))
        await self._send(text)

    async def _send(self, text: str) -> None:
        ws = self.ws
        if ws is None:
            return
        try:
            await ws.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.detach(ws)

    async def _frames(self) -> None:
        """Every output frame of the engine session, as events."""
        try:
            while (frame := await self.session.recv()) is not None:
                if "audio" not in frame:
                    continue  # the first frame only fills the delay pattern
                audio = b64(pcm16(frame["audio"]))
                await self.emit("response.output_audio.delta", delta=audio)
                await self.emit("response.audio.delta", delta=audio)
                ids = [t for t in frame["text_token_ids"] if t not in TEXT_PADDING]
                if ids:
                    text = frame.get("text", "")
                    await self.emit("response.output_audio_transcript.delta", delta=text, token_ids=ids)
        except Exception as e:  # the stage failed the session: say so, and end it
            await self.emit("error", error={"type": "server_error", "code": "session_failed", "message": str(e)})
        await self.emit("session.closed", session={"id": self.id})
        self.end()

    async def resume_on(self, ws: WebSocket, after: int) -> int:
        """Put the paused session on ``ws``: replay the events after ``after`` (those emitted meanwhile too, in
        order), then attach; how many were replayed."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.ack(after)
        sent, count = after, 0
        while pending := [(s, t) for s, t in self.unacked if s > sent]:
            for seq, text in pending:
                await ws.send_text(text)
                sent, count = seq, count + 1
        self.ws = ws  # no await since the last check: nothing emitted in between is missed
        return count

    def detach(self, ws: WebSocket) -> None:
        """The socket is gone: pause, and end the session unless it is resumed within the grace period."""
        if self.ws is not ws:
            return
        self.ws = None
        if not self.closed.is_set():
            self._expiry = asyncio.get_running_loop().call_later(
                self.grace_s, lambda: asyncio.ensure_future(self.abort())
            )

    def ack(self, seq: int) -> None:
        self.unacked = [(s, t) for s, t in self.unacked if s > seq]

    async def abort(self) -> None:
        await self.session.abort()
        self._pump.cancel()
        self.end()

    def end(self) -> None:
        self.registry.pop(self.id, None)
        self.closed.set()


def decode_append(event: dict[str, Any]) -> np.ndarray:
    audio = event.get("audio")
    if not isinstance(audio, str):
        raise InvalidRequestError("audio", "expected base64 PCM16 (mono, 24 kHz)")
    if len(audio) > MAX_APPEND_BYTES * 4 // 3 + 4:
        raise InvalidRequestError("audio", f"one append holds at most {MAX_APPEND_BYTES} bytes (10 s)")
    try:
        raw = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError("audio", "not valid base64") from None
    if len(raw) % 2:
        raise InvalidRequestError("audio", f"PCM16 has 2 bytes per sample, got {len(raw)} bytes")
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768


def session_params(event: dict[str, Any]) -> dict[str, Any]:
    session = event.get("session") or {}
    if not isinstance(session, dict):
        raise InvalidRequestError("session", "expected an object")
    rate = session.get("input_sample_rate", SAMPLE_RATE)
    audio_format = session.get("input_audio_format", {})
    if isinstance(audio_format, dict) and audio_format.get("rate") not in (None, SAMPLE_RATE):
        rate = audio_format.get("rate")
    if rate != SAMPLE_RATE:
        raise InvalidRequestError("input_sample_rate", f"this model takes {SAMPLE_RATE} Hz PCM16, got {rate!r}")
    if session.get("persona") is not None:
        raise InvalidRequestError("persona", "the persona's text prompt is `instructions`, with a `voice` preset")
    return {k: session[k] for k in PARAMS if k in session}


async def error_event(
    conn: DuplexConnection | None,
    ws: WebSocket,
    param: str | None,
    message: str,
    code: str,
    kind: str = "invalid_request_error",
) -> None:
    error = {"type": kind, "code": code, "message": message, "param": param}
    if conn is not None:
        await conn.emit("error", error=error)
    else:
        await ws.send_text(json.dumps({"type": "error", "event_id": event_id(), "server_event_seq": 0, "error": error}))


class DuplexCollector:
    """/metrics of a duplex model, read at scrape time from its stage's first replica: live sessions, the slowest
    recent step per session count, and frames stepped late (in a step longer than a frame's period)."""

    def __init__(self, engine: Any):
        self.engine = engine

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        sessions = GaugeMetricFamily("omnistage_duplex_sessions", "live full-duplex sessions (slots held)")
        step = GaugeMetricFamily(
            "omnistage_duplex_step_seconds", "slowest recent duplex step, by sessions in it", labels=["sessions"]
        )
        late = CounterMetricFamily("omnistage_duplex_frames_late", "frames stepped slower than real time")
        try:
            stage = self.engine.replicas(self.engine.pipeline.stages[0].stage_id)[0]
        except (RuntimeError, IndexError):  # not started yet
            stage = None
        if stage is not None and stage.model is not None:
            sessions.add_metric([], stage.slots_held())
            for n, seconds in sorted(stage.recent_step_seconds().items()):
                step.add_metric([str(n)], seconds)
            late.add_metric([], stage.late_frames)
        yield from (sessions, step, late)
