"""Transcription results in OpenAI's response formats: json, text, srt, vtt, verbose_json.

A transcript is the model's text per audio window (Whisper hears 30 s at a time), in segments: each window
one segment from its offset to its end, or, for a recogniser that writes timestamp tokens (Whisper, in
verbose_json / srt / vtt), the segments they mark inside each window (server/segments.py). Word timings are
not produced.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
MEDIA_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain",
    "srt": "application/x-subrip",
    "vtt": "text/vtt",
}


@dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int] = field(default_factory=list)
    avg_logprob: float | None = None  # known when the window's log-probabilities were asked for
    seek: int | None = None  # the window's start in 10 ms frames (openai-whisper's seek); None: from ``start``


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
        return {
            "task": self.task,
            "language": self.language,
            "duration": round(self.duration, 3),
            "text": self.text,
            "segments": [_verbose(i, s, self.temperature) for i, s in enumerate(self.segments)],
            "usage": self.usage(),
        }

    def srt(self) -> str:
        return "".join(
            f"{i + 1}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
            for i, s in enumerate(self.segments)
        )

    def vtt(self) -> str:
        return "WEBVTT\n\n" + "".join(
            f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n" for s in self.segments
        )

    def render(self, fmt: str) -> Any:
        """The response body for ``fmt``: a dict (json formats) or a string."""
        return {
            "json": self.json,
            "verbose_json": self.verbose_json,
            "text": lambda: self.text,
            "srt": self.srt,
            "vtt": self.vtt,
        }[fmt]()


def _verbose(i: int, s: Segment, temperature: float) -> dict[str, Any]:
    raw = s.text.encode()
    seek = s.seek if s.seek is not None else int(round(s.start * 100))
    return {
        "id": i,
        "seek": seek,
        "start": round(s.start, 3),
        "end": round(s.end, 3),
        "text": s.text,
        "tokens": s.tokens,
        "temperature": temperature,
        "avg_logprob": s.avg_logprob,
        "compression_ratio": len(raw) / len(zlib.compress(raw)) if raw else 0.0,
        "no_speech_prob": None,
    }  # (no no-speech probability is computed, as in vLLM's own server)


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


@dataclass
class LanguagePrefix:
    """A recogniser that names the language it hears before the transcript when none is forced (Qwen3-ASR:
    ``language German<asr_text>the text``, from ``info.transcription.language_prefix``): the text
    without that prefix, fed whole or delta by delta, and the language it named. The rule is ``vllm serve``'s
    (``Qwen3ASRStreamingPostProcessor``): text that may still become the prefix is held back; once the tag
    arrives the transcript is what follows its last occurrence; text that cannot be the prefix passes as it is."""

    tag: str  # "<asr_text>"
    lead: str  # "language "
    names: dict[str, str]  # the prefix's language names, lowercase -> ISO 639-1 codes
    max_prefix_chars: int = 50
    raw: str = ""
    sent: str = ""
    prefixed: bool | None = None  # undecided until the tag arrives or the text cannot be the prefix

    def feed(self, delta: str, finished: bool = False) -> str:
        """The transcript text this delta adds (all of it, given the whole text with ``finished``)."""
        self.raw += delta
        if self.prefixed is None:
            head = self.raw.lstrip()
            may_be = self.lead.startswith(head) or (
                head.startswith(self.lead) and "\n" not in head and len(head) < self.max_prefix_chars
            )
            if self.tag in self.raw:
                self.prefixed = True
            elif may_be and not finished:
                return ""
            else:
                self.prefixed = False
        text = self.raw.rsplit(self.tag, 1)[1] if self.prefixed else self.raw
        new, self.sent = text[len(self.sent) :], text
        return new

    def language(self) -> str | None:
        """The ISO code of the language the prefix named (None: no prefix, or a name this table lacks)."""
        if not self.prefixed:
            return None
        head = self.raw.split(self.tag, 1)[0].strip()
        name = head[len(self.lead) :].strip() if head.startswith(self.lead) else head
        return self.names.get(name.lower())
