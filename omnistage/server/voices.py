"""Cloned voices: a reference clip + its transcript registered under a name (POST /v1/audio/voices),
then used as ``voice: "<name>"`` on /v1/audio/speech.

Persisted as rows of kind ``voice`` in the server's job store (jobs.py, SQLite under the storage
path), the uploaded file kept as it was sent (base64 in the row): no file that the storage TTL could
expire, and a restarted server has the same voices. The registry reads the rows once, on first use,
and keeps each voice's decoded samples in memory. The speech LM encodes a clip with its codec (and
caches the codes by content), so a registered voice costs one encode per LM replica.
"""

from __future__ import annotations

import asyncio
import base64
import re
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from omnistage.server.errors import APIError, bad_request
from omnistage.server.jobs import JobStore
from omnistage.server.media import MediaLimits, audio_from_bytes

KIND = "voice"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
DEFAULT_MAX_REF_AUDIO_S = 30.0  # for pipelines that clone but do not say their limit


class VoiceForm(BaseModel):
    """The text fields of POST /v1/audio/voices (multipart; the ``audio`` file part is added by the route's
    OpenAPI entry). The route reads the form itself (``check_name``): this model documents it."""

    name: str = Field(pattern=NAME.pattern, description="the voice's name, used as voice on /v1/audio/speech")
    text: str = Field(min_length=1, description="the transcript of the clip")


@dataclass
class Voice:
    name: str
    text: str  # the clip's transcript
    data: bytes  # the uploaded audio file, as sent
    sample_rate: int
    duration_s: float
    created_at: int = field(default_factory=lambda: int(time.time()))
    _samples: np.ndarray | None = field(default=None, repr=False)

    def public(self) -> dict[str, Any]:
        return {
            "id": self.name,
            "object": "voice",
            "name": self.name,
            "type": "cloned",
            "text": self.text,
            "created_at": self.created_at,
            "sample_rate": self.sample_rate,
            "duration_s": round(self.duration_s, 3),
        }

    def record(self) -> dict[str, Any]:
        return {**self.public(), "audio": base64.b64encode(self.data).decode("ascii")}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Voice:
        return cls(
            name=record["name"],
            text=record["text"],
            data=base64.b64decode(record["audio"]),
            sample_rate=int(record["sample_rate"]),
            duration_s=float(record["duration_s"]),
            created_at=int(record["created_at"]),
        )

    def samples(self) -> tuple[np.ndarray, int]:
        if self._samples is None:
            self._samples, _ = audio_from_bytes(self.data, "voice")
        return self._samples, self.sample_rate


def clip_from_bytes(
    data: bytes, field_name: str, max_seconds: float, limits: MediaLimits | None = None, mime: str | None = None
) -> tuple[np.ndarray, int]:
    """Mono float32 samples and rate of an uploaded / inline reference clip; 400 naming the field if it does
    not decode, is empty or silent-length, or is longer than ``max_seconds`` (the server's decode limits,
    checked from the header and while decoding, come first)."""
    audio, rate = audio_from_bytes(data, field_name, limits, mime=mime)
    if audio.size == 0:
        raise bad_request(f"{field_name}: the clip has no samples", field_name)
    seconds = audio.size / rate
    if seconds > max_seconds:
        raise bad_request(
            f"{field_name}: the clip is {seconds:.1f} s long; at most {max_seconds:g} s is accepted", field_name
        )
    if not np.isfinite(audio).all():
        raise bad_request(f"{field_name}: the clip has non-finite samples", field_name)
    return audio, rate


class VoiceRegistry:
    def __init__(self, jobs: JobStore):
        self.jobs = jobs
        self._voices: dict[str, Voice] | None = None
        self._lock = asyncio.Lock()

    async def _all(self) -> dict[str, Voice]:
        async with self._lock:
            if self._voices is None:
                self._voices = {}
                for record in await self.jobs.load(KIND):
                    try:
                        voice = Voice.from_record(record)
                    except (KeyError, ValueError, TypeError):
                        continue  # a damaged row must not take the other voices down
                    self._voices[voice.name] = voice
            return self._voices

    async def list(self) -> list[Voice]:
        return sorted((await self._all()).values(), key=lambda v: (v.created_at, v.name))

    async def get(self, name: str) -> Voice | None:
        return (await self._all()).get(name)

    async def add(self, voice: Voice) -> None:
        voices = await self._all()
        if voice.name in voices:
            raise APIError(
                409,
                f"name: a voice named {voice.name!r} already exists (DELETE it first)",
                param="name",
                code="voice_exists",
            )
        voices[voice.name] = voice
        try:
            await self.jobs.put(KIND, _row_id(voice.name), "ready", voice.created_at, voice.record())
        except BaseException:
            voices.pop(voice.name, None)
            raise

    async def delete(self, name: str) -> bool:
        voices = await self._all()
        if voices.pop(name, None) is None:
            return False
        await self.jobs.delete(_row_id(name))
        return True


def _row_id(name: str) -> str:
    return f"{KIND}:{name}"  # job ids of other kinds never contain ':'


_registries: weakref.WeakKeyDictionary[Any, VoiceRegistry] = weakref.WeakKeyDictionary()


def registry(state: Any) -> VoiceRegistry:
    """The voice registry of one server (its job store)."""
    reg = _registries.get(state)
    if reg is None:
        reg = _registries[state] = VoiceRegistry(state.jobs)
    return reg


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise bad_request(
            "name: a voice name is 1-64 letters, digits, '_', '.' or '-' (starting with a letter or digit)", "name"
        )
    return name
