"""What the realtime route tests share: the servers' settings (conftest.py builds the servers) and helpers
that read a server's state or drive a session (the client side: tests/server/realtime_client.py)."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from tests.server.realtime_client import b64, pcm16_bytes

KEY = "sk-realtime-test"
EVENT_LIMIT = 64 << 10
BUFFER_S = 4.0  # seconds: a VAD turn fits, five appends of 0.9 s do not
IDLE = {0: (0, 0), 1: (0, 0), 2: (0, 0), 3: (0, 0)}  # wait_idle: nothing runs or waits in any stage


def user_text(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def wait_idle(srv, timeout: float = 10.0) -> dict:
    """Stage stats once nothing runs or waits in any stage (or as they are when ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = srv.engine.stage_stats()
        if all(s.running == 0 and s.queue_depth == 0 for s in stats.values()) or time.monotonic() > deadline:
            return {sid: (s.running, s.queue_depth) for sid, s in stats.items()}
        await asyncio.sleep(0.02)


async def wait_open_zero(srv) -> bool:
    deadline = time.monotonic() + 5
    while srv.state.realtime.open and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return srv.state.realtime.open == 0


def vad_session(rate: int, **vad) -> dict:
    return {
        "type": "realtime",
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": rate}, "turn_detection": {"type": "server_vad", **vad}}
        },
    }


async def stream_audio(conn, x: np.ndarray, rate: int, chunk_s: float = 0.1) -> None:
    pcm = pcm16_bytes(x)
    step = int(chunk_s * rate) * 2
    for i in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=b64(pcm[i : i + step]))
