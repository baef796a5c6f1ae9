"""Transcription results in OpenAI's response formats: json, text, srt, vtt, verbose_json.

A transcript is the model's text per audio window (Whisper hears 30 s at a time): each window is one
segment from its offset to its end. Timestamp tokens inside a window (finer segments, word timings)
are not produced yet.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MEDIA_TYPES = {"json": "application/json", "verbose_json": "application/json", "text": "text/plain",
               "srt": "application/x-subrip", "vtt": "text/vtt"}


@dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)


@dataclass
class Transcript:
    task: str
    language: str
    duration: float
    segments: list[Segment]
    temperature: float = 0.0
    separator: str = " "  # between windows' texts (vLLM's join; "" for languages written without spaces)

    @property
    def text(self) -> str:
        return self.separator.join(s.text for s in self.segments)

    def usage(self) -> dict[str, Any]:
        return {"type": "duration", "seconds": round(self.duration, 3)}

    def json(self) -> dict[str, Any]:
        return {"text": self.text, "usage": self.usage()}

    def verbose_json(self) -> dict[str, Any]:
        return {"task": self.task, "language": self.language, "duration": round(self.duration, 3), "text": self.text,
                "segments": [_verbose(i, s, self.temperature) for i, s in enumerate(self.segments)],
                "usage": self.usage()}

    def srt(self) -> str:
        return "".join(f"{i + 1}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
                       for i, s in enumerate(self.segments))

    def vtt(self) -> str:
        return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n"
                                      for s in self.segments)

    def render(self, fmt: str) -> Any:
        """The response body for ``fmt``: a dict (json formats) or a string."""
        return {"json": self.json, "verbose_json": self.verbose_json, "text": lambda: self.text,
                "srt": self.srt, "vtt": self.vtt}[fmt]()


def _verbose(i: int, s: Segment, temperature: float) -> dict[str, Any]:
    raw = s.text.encode()
    return {"id": i, "seek": int(round(s.start * 100)), "start": round(s.start, 3), "end": round(s.end, 3),
            "text": s.text, "tokens": s.tokens, "temperature": temperature,
            # no per-token log-probabilities or no-speech probability are computed (as vLLM's own server)
            "avg_logprob": None, "compression_ratio": len(raw) / len(zlib.compress(raw)) if raw else 0.0,
            "no_speech_prob": None}


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"
