"""Realtime sessions as calls of the chaos load (``chaos.Load``): each call opens a ``/v1/realtime`` session with
the official ``openai`` client's WebSocket (``client.realtime.connect``), as a user's app would, and classifies
how it ended against what the server promises:

- a spoken turn (``input_audio_buffer.append`` + commit + ``response.create``) ends with ``response.done``:
  ``completed`` / ``incomplete`` with audio (``ok``), or — a stage died or is restarting — one ``error`` event
  ``stage_unavailable`` and then ``response.done`` ``failed`` (``error_event`` once deltas had arrived,
  ``unavailable`` before any);
- an abandoned session closes its socket on the first audio delta (``abandoned``);
- bad events (an unknown type, audio that is not base64) each get their ``error`` event, and the session then
  answers a turn (``rejected``);
- nothing takes longer than ``DEADLINE_S``; a socket that closes without ``response.done``, any other error,
  or a 200 turn without audio is a ``VIOLATION``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from omnistage.bench.realtime import CHUNK_S, pcm16
from omnistage.testing.chaos import DEADLINE_S, Violation

DELTAS = ("response.output_text.delta", "response.output_audio_transcript.delta", "response.output_audio.delta")


@dataclass
class Answer:
    """What one response sent, up to its ``response.done``."""

    status: str | None = None
    text: str = ""
    pcm: bytes = b""
    deltas: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)


def _url(c: httpx.Client) -> str:
    return str(c.base_url).rstrip("/")


def _connect(url: str, model: str) -> Any:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="chaos", max_retries=0)
    return client.realtime.connect(model=model)


async def _recv(conn: Any, until: float) -> Any:
    from websockets.exceptions import ConnectionClosed

    try:
        return await asyncio.wait_for(conn.recv(), max(0.0, until - time.monotonic()))
    except ConnectionClosed as e:
        raise Violation(f"the server closed the session without response.done ({e})") from None


async def _expect(conn: Any, kind: str, until: float) -> Any:
    while (ev := await _recv(conn, until)).type != kind:
        if ev.type == "error":
            raise Violation(f"{ev.error.code} error waiting for {kind}: {ev.error.message}")
    return ev


async def _open(conn: Any, session: dict[str, Any], until: float) -> None:
    await _expect(conn, "session.created", until)
    await conn.session.update(session=session)
    await _expect(conn, "session.updated", until)


async def _speak(conn: Any, pcm: bytes, rate: int) -> None:
    step = int(CHUNK_S * rate) * 2
    for i in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step]).decode())
    await conn.input_audio_buffer.commit()
    await conn.response.create()


async def _answer(conn: Any, until: float, leave_on_delta: bool = False) -> Answer:
    """Events up to ``response.done`` (or the first delta, with ``leave_on_delta``)."""
    a = Answer()
    while True:
        ev = await _recv(conn, until)
        if ev.type in DELTAS:
            a.deltas += 1
            if leave_on_delta:
                return a
            if ev.type == "response.output_audio.delta":
                a.pcm += base64.b64decode(ev.delta)
            else:
                a.text += ev.delta
        elif ev.type == "error":
            a.errors.append(ev.error.model_dump())
        elif ev.type == "response.done":
            a.status = ev.response.status
            return a


def classify(a: Answer) -> str:
    """A finished turn's outcome (see the module docstring)."""
    if a.status in ("completed", "incomplete") and not a.errors and a.pcm:
        return "ok"
    if a.status == "failed" and [e.get("code") for e in a.errors] == ["stage_unavailable"]:
        return "error_event" if a.deltas else "unavailable"
    raise Violation(f"turn ended {a.status} after {a.deltas} deltas, {len(a.pcm)} audio bytes, errors {a.errors}")


def _sync(make: Callable[[str, float], Coroutine[Any, Any, str]]) -> Callable[[httpx.Client, int], str]:
    """A load call: the session runs in its own event loop in the load's thread, bounded by the deadline."""

    async def bounded(url: str) -> str:
        until = time.monotonic() + DEADLINE_S
        try:
            return await asyncio.wait_for(make(url, until), DEADLINE_S + 5)
        except TimeoutError:
            raise Violation(f"the session did not end within {DEADLINE_S:.0f} s") from None

    return lambda c, i: asyncio.run(bounded(_url(c)))


Turn = tuple[str, dict[str, Any], np.ndarray, int]  # (model, session.update fields, the clip, its rate)


async def _turn(url: str, turn: Turn, until: float, leave_on_delta: bool = False) -> Answer:
    model, session, clip, rate = turn
    async with _connect(url, model) as conn:
        await _open(conn, session, until)
        await _speak(conn, pcm16(clip), rate)
        return await _answer(conn, until, leave_on_delta)  # (leaving closes the socket, mid-response or not)


def spoken_turn(turn: Turn) -> Callable[[httpx.Client, int], str]:
    async def run(url: str, until: float) -> str:
        return classify(await _turn(url, turn, until))

    return _sync(run)


def abandoned_turn(turn: Turn) -> Callable[[httpx.Client, int], str]:
    """The client leaves on the first delta: the server must abort the response in every stage."""

    async def run(url: str, until: float) -> str:
        a = await _turn(url, turn, until, leave_on_delta=True)
        return "abandoned" if a.deltas else classify(a)

    return _sync(run)


BAD_EVENTS = [
    ({"type": "session.nope", "event_id": "bad1"}, "invalid_event_type"),
    ({"type": "input_audio_buffer.append", "event_id": "bad2", "audio": "@@not base64@@"}, "invalid_value"),
]


def bad_events(turn: Turn) -> Callable[[httpx.Client, int], str]:
    """Each of ``BAD_EVENTS`` gets its ``error`` event naming it; then the same session answers a spoken turn."""
    model, session, clip, rate = turn

    async def run(url: str, until: float) -> str:
        async with _connect(url, model) as conn:
            await _open(conn, session, until)
            for event, code in BAD_EVENTS:
                await conn.send_raw(json.dumps(event))  # (frames the typed client would never send)
                err = (await _expect(conn, "error", until)).error
                if err.code != code or err.event_id != event["event_id"]:
                    raise Violation(f"{event['type']} answered {err.code} for {err.event_id}, wanted {code}")
            await _speak(conn, pcm16(clip), rate)
            after = classify(await _answer(conn, until))
            return "rejected" if after == "ok" else f"rejected, next turn {after}"

    return _sync(run)


def greedy_turn(turn: Turn) -> Callable[[httpx.Client], bytes]:
    """A probe: one seeded (greedy) spoken turn's transcript and PCM, which must not change across the chaos."""

    def probe(c: httpx.Client) -> bytes:
        a = asyncio.run(_turn(_url(c), turn, time.monotonic() + DEADLINE_S))
        assert classify(a) == "ok", a
        return a.text.encode() + b"\0" + a.pcm

    return probe
