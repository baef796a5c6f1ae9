"""Client side of the /v1/realtime tests: the official ``openai`` client's realtime connection, a raw
WebSocket for frames that client would never send, and /v1/chat/completions streamed as the reference."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from omnistage.bench.utterance import quiet, voiced  # noqa: F401 (the tests' speech-like audio)


def openai_client(url: str, key: str) -> Any:
    import openai

    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def pcm16_bytes(x: np.ndarray) -> bytes:
    """float32 samples that are exact multiples of 1/32768 -> the same values as little-endian int16."""
    return np.round(np.asarray(x, dtype=np.float64) * 32768).astype("<i2").tobytes()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass
class Reply:
    """What one response streamed, up to and including its ``response.done``."""

    types: list[str] = field(default_factory=list)
    text: str = ""  # output_text or output_audio_transcript deltas
    pcm: bytes = b""
    done: Any = None
    transcript_done: str | None = None
    text_done: str | None = None
    errors: list[Any] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.done.response.status


async def next_event(conn: Any, kind: str) -> Any:
    """The next event of ``kind`` (skipping others; an unexpected ``error`` fails the test at once)."""
    while True:
        ev = await conn.recv()
        if ev.type == kind:
            return ev
        assert ev.type != "error", ev.error


async def read_reply(conn: Any, on_event: Any = None) -> Reply:
    reply = Reply()
    while True:
        ev = await conn.recv()
        reply.types.append(ev.type)
        if on_event is not None:
            await on_event(ev, reply)
        if ev.type in ("response.output_text.delta", "response.output_audio_transcript.delta"):
            reply.text += ev.delta
        elif ev.type == "response.output_audio.delta":
            reply.pcm += base64.b64decode(ev.delta)
        elif ev.type == "response.output_audio_transcript.done":
            reply.transcript_done = ev.transcript
        elif ev.type == "response.output_text.done":
            reply.text_done = ev.text
        elif ev.type == "error":
            reply.errors.append(ev.error)
        elif ev.type == "response.done":
            reply.done = ev
            return reply


def chat_stream(url: str, key: str, messages: list[dict], **body: Any) -> tuple[str, bytes]:
    """/v1/chat/completions streamed: the text and the PCM16 audio it sends."""
    text, pcm = "", b""
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        timeout=300,
        headers={"Authorization": f"Bearer {key}"},
        json={"messages": messages, "stream": True, **body},
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice["delta"]
                if isinstance(delta.get("content"), str):
                    text += delta["content"]
                if delta.get("audio"):
                    pcm += base64.b64decode(delta["audio"]["data"])
    return text, pcm


def chat_usage(url: str, key: str, messages: list[dict], **body: Any) -> dict[str, Any]:
    """/v1/chat/completions unstreamed: the ``usage`` it answers."""
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=300,
        headers={"Authorization": f"Bearer {key}"},
        json={"messages": messages, **body},
    )
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def ws_url(url: str, model: str | None = None) -> str:
    return url.replace("http://", "ws://") + "/v1/realtime" + (f"?model={model}" if model else "")
