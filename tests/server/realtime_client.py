"""Client side of the /v1/realtime tests: the official ``openai`` client's realtime connection, a raw
WebSocket for frames that client would never send, and /v1/chat/completions streamed as the reference."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np


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
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=300, headers={"Authorization": f"Bearer {key}"},
                      json={"messages": messages, "stream": True, **body}) as r:
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


def ws_url(url: str, model: str | None = None) -> str:
    return url.replace("http://", "ws://") + "/v1/realtime" + (f"?model={model}" if model else "")


# ------------------------------------------------------------------------------------------- test audio


def _resonator(x: np.ndarray, freq: float, bandwidth: float, rate: int) -> np.ndarray:
    """A two-pole resonance (a formant) at ``freq``."""
    r = np.exp(-np.pi * bandwidth / rate)
    a1, a2, gain = -2 * r * np.cos(2 * np.pi * freq / rate), r * r, 1 - r
    y = np.zeros_like(x)
    y1 = y2 = 0.0
    for i, v in enumerate(x):
        y1, y2 = gain * v - a1 * y1 - a2 * y2, y1
        y[i] = y1
    return y


def voiced(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """Speech-like sound: a glottal pulse train (~120 Hz, gliding) through three vowel formants, in 4 Hz
    syllables over a faint noise floor. Values are multiples of 1/32768 (PCM16-exact)."""
    n = int(seconds * rate)
    t = np.arange(n) / rate
    f0 = 120 * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))
    x = (np.diff(np.floor(np.cumsum(f0 / rate)), prepend=0) > 0).astype(np.float64)
    for freq, bw in ((700, 130), (1220, 70), (2600, 160)):
        x = _resonator(x, freq, bw, rate)
    x = x * 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    x = 0.3 * x / np.abs(x).max() + quiet(seconds, rate, seed)
    return (np.round(np.clip(x, -1, 1 - 1 / 32768) * 32768) / 32768).astype(np.float32)


def quiet(seconds: float, rate: int, seed: int = 1) -> np.ndarray:
    """A faint noise floor (a room, not digital silence)."""
    x = 0.002 * np.random.default_rng(seed).standard_normal(int(seconds * rate))
    return (np.round(x * 32768) / 32768).astype(np.float32)
