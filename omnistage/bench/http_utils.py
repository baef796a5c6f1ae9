"""Small HTTP helpers shared by the request functions: SSE parsing, media decoding."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx


async def iter_sse_json(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Yield each ``data:`` JSON object of a server-sent-event stream until ``[DONE]``."""
    async for line in response.aiter_lines():
        line = line.strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            return
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


def error_text(status: int, body: bytes) -> str:
    """``HTTP 400: message`` from an OpenAI-shaped error body (or the raw text)."""
    text = body[:500].decode("utf-8", "replace")
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict) and err.get("message"):
            text = err["message"]
        elif isinstance(err, str):
            text = err
    except (ValueError, AttributeError):
        pass
    return f"HTTP {status}: {text}"


def decode_data_url(url: str) -> bytes:
    """``data:image/png;base64,....`` -> bytes (plain base64 accepted too)."""
    if url.startswith("data:"):
        url = url.split(",", 1)[1]
    return base64.b64decode(url)


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def audio_seconds(wav_bytes: bytes) -> float | None:
    """Duration of an encoded audio file (wav/flac/...) or None if it can't be read."""
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(wav_bytes))
    except Exception:  # not a container soundfile reads (e.g. mp3 on old libsndfile)
        return None
    return info.frames / info.samplerate if info.samplerate else None
