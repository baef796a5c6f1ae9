"""``moshi.server``'s own protocol (``GET /api/chat``), on the duplex sessions ``/v1/realtime?duplex=1`` uses, so
the authors' ``moshi.client`` and web UI talk to omnistage unchanged.

Every message is binary: one kind byte, then its payload.

- ``0x00`` handshake: the server sends it once the session holds its slot; the client then starts talking;
- ``0x01`` audio, both ways: Ogg/Opus pages of mono audio at 24 kHz (the authors' ``sphn`` reads and writes them);
  each output frame (80 ms) is one page;
- ``0x02`` text, server to client: the piece of each non-padding text token, UTF-8 ("▁" as a space);
- ``0x05`` error, server to client: UTF-8 words naming what was wrong (the web UI's protocol has this kind;
  ``moshi.client`` logs it as an unknown kind and goes on).

A message the server cannot take (text instead of binary, empty, an unknown kind, audio that is not Ogg/Opus) is
answered with an error message and the conversation goes on: ``moshi.server`` logs and skips such messages.
Sampling comes from the URL's query, as the authors' web UI sends it (``sampling_params``); the session ends when
the socket closes (this protocol has no resume).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import sphn
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omnistage.errors import InvalidRequestError
from omnistage.server.realtime.duplex import SAMPLE_RATE

HANDSHAKE, AUDIO, TEXT, ERROR = b"\x00", b"\x01", b"\x02", b"\x05"
OGG_PAGE = b"OggS"  # every Ogg page starts with its capture pattern
# the web UI's names -> the session's params (realtime/duplex.py); the values are numbers in the URL's query
QUERY_PARAMS = {
    "audio_temperature": ("temperature", float),
    "audio_topk": ("top_k", int),
    "text_temperature": ("temperature_text", float),
    "text_topk": ("top_k_text", int),
    "text_seed": ("seed", int),
}
# PersonaPlex's web UI's persona fields (a voice preset's file name, the text prompt) -> the session's params
PERSONA_QUERY = {"voice_prompt": "voice", "text_prompt": "instructions"}
# knobs of the authors' Rust server the web UI always sends: taken at the values that change nothing
NEUTRAL = {"pad_mult": 0.0, "repetition_penalty": 1.0}
CHECKED = ("audio_seed", "repetition_penalty_context")  # sent by the web UI too: integers, not used


def sampling_params(query: Mapping[str, str]) -> dict[str, Any]:
    """The session's params from the query (``InvalidRequestError`` naming the query field). ``text_seed`` seeds
    the session's one generator (text and audio draws); other fields (``worker_auth_id``, ``email``, ...) are
    ignored, as ``moshi.server`` ignores its whole query."""
    params: dict[str, Any] = {}
    for name, (key, kind) in QUERY_PARAMS.items():
        if name in query:
            params[key] = number(query, name, kind)
    for name, key in PERSONA_QUERY.items():
        if query.get(name):
            params[key] = query[name]
    for name in CHECKED:
        if name in query:
            number(query, name, int)
    for name, neutral in NEUTRAL.items():
        if name in query and number(query, name, float) != neutral:
            raise InvalidRequestError(name, f"not supported by this server: only {neutral:g} (no effect) is taken")
    return params


def number(query: Mapping[str, str], name: str, kind: type) -> float | int:
    text = query[name].strip()
    try:
        value = kind(text)
    except ValueError:
        raise InvalidRequestError(
            name, f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if not np.isfinite(value):
        raise InvalidRequestError(name, f"expected a finite number, got {text!r}")
    return value


def query_name(key: str | None) -> str | None:
    """A session param's name as the query spells it (for errors the engine raised)."""
    names = {k: name for name, (k, _) in QUERY_PARAMS.items()} | {k: name for name, k in PERSONA_QUERY.items()}
    return names.get(key, key) if key is not None else None


class MoshiChat:
    """One ``/api/chat`` socket on an open duplex session: audio pages in, frames out as pages and text."""

    def __init__(self, ws: WebSocket, session: Any):
        self.ws, self.session = ws, session
        self.reader = sphn.OpusStreamReader(SAMPLE_RATE)
        self.writer = sphn.OpusStreamWriter(SAMPLE_RATE)
        self._send_lock = asyncio.Lock()  # the frame pump and the error replies share the socket

    async def run(self) -> None:
        """Until the client goes (the session is aborted) or the session fails (an error message, then close)."""
        await self.send(HANDSHAKE)
        pump = asyncio.create_task(self._frames(), name=f"moshi-chat-{self.session.id}")
        try:
            await self._receive()
        finally:
            pump.cancel()
            await self.session.abort()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def send(self, message: bytes) -> bool:
        async with self._send_lock:
            try:
                await self.ws.send_bytes(message)
            except (WebSocketDisconnect, RuntimeError, OSError):
                return False
        return True

    async def error(self, message: str) -> None:
        await self.send(ERROR + message.encode())

    async def _receive(self) -> None:
        while True:
            try:
                message = await self.ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            if data is None:
                await self.error("expected binary messages: a kind byte, then its payload")
            elif not data:
                await self.error("empty message")
            elif data[:1] == AUDIO:
                await self._audio(data[1:])
            else:
                await self.error(f"unknown message kind {data[0]}: clients send 1 (audio)")

    async def _audio(self, page: bytes) -> None:
        if not page.startswith(OGG_PAGE):
            await self.error("audio: expected an Ogg page of Opus audio (it starts with 'OggS')")
            return
        try:
            pcm = self.reader.append_bytes(page)
        except ValueError as e:
            # A broken page leaves the reader unusable, and one whose header promised more bytes than came is
            # only found out at the next page: a new reader takes this page again (and fails if it is the bad one)
            await self.error(f"audio: not Ogg/Opus ({e})")
            self.reader = sphn.OpusStreamReader(SAMPLE_RATE)
            try:
                pcm = self.reader.append_bytes(page)
            except ValueError:
                self.reader = sphn.OpusStreamReader(SAMPLE_RATE)
                return
        if len(pcm):
            try:
                await self.session.send(pcm)
            except InvalidRequestError as e:
                await self.error(f"audio: {e.message}")

    async def _frames(self) -> None:
        """Each output frame: its audio as a page, then its text piece, as ``moshi.server`` sends them."""
        try:
            while (frame := await self.session.recv()) is not None:
                if "audio" not in frame:
                    continue  # the first frame only fills the delay pattern
                page = self.writer.append_pcm(np.asarray(frame["audio"], dtype=np.float32))
                if len(page) and not await self.send(AUDIO + page):
                    return
                if frame.get("text"):  # padding tokens write nothing
                    await self.send(TEXT + frame["text"].encode())
        except Exception as e:  # the stage failed the session: say so, and end the conversation
            await self.error(f"session failed: {e}")
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self.ws.close(1011 if self.session.finish_reason != "stop" else 1000)
