"""One realtime session: its configuration (what ``session.update`` sets), the input audio buffer (and the
server VAD's turns in it) and the conversation, kept as chat turns so every response runs through the HTTP
routes' request path (bodies.py)."""

from __future__ import annotations

import base64
import copy
import uuid
from dataclasses import dataclass, field
from typing import Any

from omnistage.media.audio_decode import base64_size
from omnistage.media.limits import MediaLimits
from omnistage.server.protocol import ChatCompletionRequest, SpeechRequest
from omnistage.server.realtime.audio import pcm16_to_wav
from omnistage.server.realtime.extra_body import check_extra_body
from omnistage.server.realtime.protocol import (
    Item,
    ProtocolError,
    SessionParams,
    TurnDetection,
    decode_pcm16,
)
from omnistage.server.realtime.vad import FRAME_MS, START_FRAMES, VoiceActivity

DEFAULT_INPUT_RATE = 24000  # OpenAI's default input format: PCM16 24 kHz mono
SERVER_VAD = {
    "type": "server_vad",
    "threshold": 0.5,
    "prefix_padding_ms": 300,
    "silence_duration_ms": 500,
    "create_response": True,
    "interrupt_response": True,
    "idle_timeout_ms": None,
}  # OpenAI's defaults


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True)
class ModelInfo:
    """What the served model can do, as far as a realtime session cares."""

    name: str
    speaks: bool  # produces audio
    input_rate: int  # the rate its audio encoder hears
    output_rate: int | None  # the rate it speaks at
    voices: tuple[str, ...] = ()
    supports_speed: bool = False
    chat: bool = True  # takes chat turns (else a speech model: it speaks the last user text, /v1/audio/speech)
    writes_text: bool = True

    @property
    def body(self) -> type[ChatCompletionRequest] | type[SpeechRequest]:
        """The HTTP body a response runs as (``extra_body`` holds its fields)."""
        return ChatCompletionRequest if self.chat else SpeechRequest


@dataclass
class ConversationItem:
    id: str
    role: str
    content: list[dict[str, Any]]  # as the client sees it (no audio bytes)
    parts: list[dict[str, Any]]  # as the chat route takes them (text, input_audio WAV)
    status: str = "completed"

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": "message",
            "role": self.role,
            "status": self.status,
            "content": copy.deepcopy(self.content),
        }

    def message(self) -> dict[str, Any]:
        if self.role == "assistant" or all(p["type"] == "text" for p in self.parts):
            return {"role": self.role, "content": "".join(p.get("text", "") for p in self.parts)}
        return {"role": self.role, "content": copy.deepcopy(self.parts)}


@dataclass
class Session:
    info: ModelInfo
    max_buffer_s: float
    id: str = field(default_factory=lambda: new_id("sess"))
    instructions: str = ""
    output_modalities: list[str] = field(default_factory=list)
    input_rate: int = DEFAULT_INPUT_RATE
    voice: str | None = None
    speed: float = 1.0
    max_output_tokens: int | str = "inf"
    extra_body: dict[str, Any] = field(default_factory=dict)
    items: list[ConversationItem] = field(default_factory=list)
    buffer: bytearray = field(default_factory=bytearray)
    turn_detection: dict[str, Any] | None = None  # None: manual turns
    vad: VoiceActivity | None = None
    samples_seen: int = 0  # input samples appended (the timeline of audio_start_ms / audio_end_ms)
    buffer_start: int = 0  # the sample of that timeline buffer[0] holds
    turn: tuple[str, int] | None = None  # server VAD: (item id, first sample) of the turn being spoken
    vad_origin: int = 0  # the sample the detector started counting from
    limits: MediaLimits = field(default_factory=MediaLimits)  # the server's; bounds each decoded audio payload

    def __post_init__(self) -> None:
        self.output_modalities = self.output_modalities or (["audio"] if self.info.speaks else ["text"])

    # ------------------------------------------------------------------ configuration

    def public(self) -> dict[str, Any]:
        out_format = {"type": "audio/pcm", "rate": self.info.output_rate} if self.info.speaks else None
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self.id,
            "model": self.info.name,
            "output_modalities": list(self.output_modalities),
            "instructions": self.instructions,
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.input_rate},
                    "turn_detection": copy.deepcopy(self.turn_detection),
                    "transcription": None,
                    "noise_reduction": None,
                },
                "output": {"format": out_format, "voice": self.voice, "speed": self.speed},
            },
            "max_output_tokens": self.max_output_tokens,
            "tools": [],
            "tool_choice": "auto",
            "extra_body": copy.deepcopy(self.extra_body),
        }

    def update(self, params: SessionParams, event_id: str | None) -> None:
        """Apply the fields present in ``params``; nothing changes when one of them is refused."""

        def fail(message: str, param: str, code: str = "invalid_value") -> ProtocolError:
            return ProtocolError(f"{param}: {message}", param, code, event_id)

        if params.model is not None and params.model != self.info.name:
            raise fail(f"this server serves {self.info.name!r}, not {params.model!r}", "session.model")
        if params.tools:
            raise fail("tools are not supported yet", "session.tools", "unsupported_value")
        new: dict[str, Any] = {}
        if params.instructions is not None:
            new["instructions"] = params.instructions
        if params.output_modalities is not None:
            new["output_modalities"] = self.check_modalities(
                params.output_modalities, "session.output_modalities", event_id
            )
        if params.max_output_tokens is not None:
            new["max_output_tokens"] = params.max_output_tokens
        if params.extra_body is not None:
            new["extra_body"] = check_extra_body(params.extra_body, "session.extra_body", event_id, self.info.body)
        audio = params.audio
        if audio is not None and audio.input is not None:
            if "turn_detection" in audio.input.model_fields_set:
                new["turn_detection"] = self._turn_detection(audio.input.turn_detection, event_id)
            if audio.input.transcription is not None:
                raise fail(
                    "input transcription is not supported yet", "session.audio.input.transcription", "unsupported_value"
                )
            if audio.input.format is not None and audio.input.format.rate is not None:
                new["input_rate"] = audio.input.format.rate
        if audio is not None and audio.output is not None:
            out = audio.output
            if out.format is not None and out.format.rate is not None and out.format.rate != self.info.output_rate:
                raise fail(f"this model speaks at {self.info.output_rate} Hz only", "session.audio.output.format.rate")
            if out.voice is not None:
                new["voice"] = self.check_voice(out.voice, "session.audio.output.voice", event_id)
            if out.speed is not None:
                if out.speed != 1.0 and not self.info.supports_speed:
                    raise fail(
                        "this model does not support changing the speed",
                        "session.audio.output.speed",
                        "unsupported_value",
                    )
                new["speed"] = out.speed
        rate_changed = "input_rate" in new and new["input_rate"] != self.input_rate
        for key, value in new.items():
            setattr(self, key, value)
        if rate_changed:  # buffered samples at the old rate would be misread
            self.buffer.clear()
            self.samples_seen = self.buffer_start = 0
            self.turn = None
        if rate_changed or "turn_detection" in new:
            self._start_vad()

    def _turn_detection(self, td: TurnDetection | None, event_id: str | None) -> dict[str, Any] | None:
        param = "session.audio.input.turn_detection"
        if td is None:
            return None
        if td.type != "server_vad":
            raise ProtocolError(
                f"{param}.type: {td.type!r} is not supported yet (null or 'server_vad')",
                f"{param}.type",
                "unsupported_value",
                event_id,
            )
        if td.idle_timeout_ms is not None:
            raise ProtocolError(
                f"{param}.idle_timeout_ms: not supported yet", f"{param}.idle_timeout_ms", "unsupported_value", event_id
            )
        given = {k: v for k, v in td.model_dump().items() if v is not None}
        return {**SERVER_VAD, **given}

    def _start_vad(self) -> None:
        td = self.turn_detection
        self.turn = None
        self.vad = None if td is None else VoiceActivity(self.input_rate, td["threshold"], td["silence_duration_ms"])
        self.vad_origin = self.samples_seen  # the detector counts from here

    # ------------------------------------------------------------------ server VAD

    def detect(self, pcm: bytes) -> list[tuple[str, int]]:
        """The detector's events for ``pcm`` (just appended), in the session's ms timeline."""
        if self.vad is None:
            return []
        origin_ms = self.vad_origin * 1000 // self.input_rate
        return [(kind, origin_ms + ms) for kind, ms in self.vad.feed(pcm)]

    def _sample(self, ms: int) -> int:
        return ms * self.input_rate // 1000

    def speech_started(self, ms: int) -> tuple[str, int]:
        """A turn begins at ``ms``: its item id and where its audio starts (``prefix_padding_ms`` earlier)."""
        assert self.turn_detection is not None
        start = max(self.buffer_start, self._sample(ms - self.turn_detection["prefix_padding_ms"]))
        self.turn = (new_id("item"), start)
        return self.turn[0], start * 1000 // self.input_rate

    def speech_stopped(self, ms: int) -> ConversationItem | None:
        """The turn ends at ``ms``: its audio becomes a user item; the buffer keeps what follows."""
        if self.turn is None:  # committed or cleared by the client meanwhile
            return None
        item_id, start = self.turn
        self.turn = None
        end = max(self._sample(ms), start)
        a, b = (max(start, self.buffer_start) - self.buffer_start) * 2, (end - self.buffer_start) * 2
        pcm = bytes(self.buffer[a:b])
        del self.buffer[:b]
        self.buffer_start = end
        if not pcm:
            return None
        return ConversationItem(item_id, "user", [{"type": "input_audio", "transcript": None}], [self._audio_part(pcm)])

    def trim_idle(self) -> None:
        """Between turns only the last moments can still open one: older audio is let go (bounded memory)."""
        if self.vad is None or self.turn is not None or self.turn_detection is None:
            return
        keep = self._sample(self.turn_detection["prefix_padding_ms"] + (START_FRAMES + 2) * FRAME_MS)
        drop = len(self.buffer) // 2 - keep
        if drop > 0:
            del self.buffer[: drop * 2]
            self.buffer_start += drop

    def check_modalities(self, asked: list[str], param: str, event_id: str | None) -> list[str]:
        if "audio" in asked and not self.info.speaks:
            raise ProtocolError(
                f"{param}: model {self.info.name!r} does not produce audio", param, "invalid_value", event_id
            )
        if "text" in asked and not self.info.writes_text:
            raise ProtocolError(
                f"{param}: model {self.info.name!r} only speaks (use ['audio'])", param, "invalid_value", event_id
            )
        return list(asked)

    def check_voice(self, voice: Any, param: str, event_id: str | None) -> str:
        if not isinstance(voice, str):
            raise ProtocolError(f"{param}: custom voice ids are not supported", param, "unsupported_value", event_id)
        names = {v.lower(): v for v in self.info.voices}
        if voice.lower() not in names:
            raise ProtocolError(
                f"{param}: {voice!r} is not one of this model's voices ({', '.join(self.info.voices) or 'none'})",
                param,
                "invalid_value",
                event_id,
            )
        return names[voice.lower()]

    # ------------------------------------------------------------------ input audio

    def append_audio(self, data: str, event_id: str | None) -> bytes:
        """Decode base64 PCM16 into the input buffer; returns the PCM appended. Both limits (the buffer's room,
        the server's media bytes) are checked from the base64 length, before decoding."""
        limit = int(self.max_buffer_s * self.input_rate) * 2
        if len(self.buffer) + base64_size(data) > limit:
            raise ProtocolError(
                f"audio: the input audio buffer would exceed {self.max_buffer_s:g} s "
                f"({limit} bytes at {self.input_rate} Hz); commit or clear it first",
                "audio",
                "input_audio_buffer_full",
                event_id,
            )
        pcm = decode_pcm16(data, "audio", event_id, self.limits.max_bytes)
        self.buffer += pcm
        self.samples_seen += len(pcm) // 2
        return pcm

    def clear_audio(self) -> None:
        self.buffer_start += len(self.buffer) // 2
        self.buffer.clear()
        self.turn = None

    def commit_audio(self, event_id: str | None) -> ConversationItem:
        if not self.buffer:
            raise ProtocolError(
                "the input audio buffer is empty: append audio before committing",
                None,
                "input_audio_buffer_commit_empty",
                event_id,
            )
        item_id = self.turn[0] if self.turn is not None else new_id("item")
        item = ConversationItem(
            item_id, "user", [{"type": "input_audio", "transcript": None}], [self._audio_part(bytes(self.buffer))]
        )
        self.clear_audio()
        return item

    def _audio_part(self, pcm: bytes) -> dict[str, Any]:
        wav = pcm16_to_wav(pcm, self.input_rate, self.info.input_rate)
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode("ascii"), "format": "wav"}}

    # ------------------------------------------------------------------ conversation

    def item_from(self, item: Item, param: str, event_id: str | None) -> ConversationItem:
        """A client's ``conversation.item.create`` item as a conversation item (its audio decoded once)."""
        if item.type != "message":
            raise ProtocolError(
                f"{param}.type: {item.type!r} items are not supported yet (only messages)",
                f"{param}.type",
                "unsupported_value",
                event_id,
            )
        if item.role is None:
            raise ProtocolError(f"{param}.role: field required", f"{param}.role", "invalid_value", event_id)
        if item.id is not None and self.find(item.id) is not None:
            raise ProtocolError(
                f"{param}.id: an item {item.id!r} already exists", f"{param}.id", "invalid_value", event_id
            )
        content, parts = [], []
        allowed = {
            "user": ("input_text", "input_audio"),
            "system": ("input_text",),
            "assistant": ("output_text", "text", "output_audio"),
        }[item.role]
        for i, part in enumerate(item.content):
            where = f"{param}.content[{i}]"
            if part.type not in allowed:
                raise ProtocolError(
                    f"{where}.type: a {item.role} item takes {', '.join(allowed)}",
                    f"{where}.type",
                    "invalid_value",
                    event_id,
                )
            if part.type == "input_audio":
                if part.audio is None:
                    raise ProtocolError(f"{where}.audio: field required", f"{where}.audio", "invalid_value", event_id)
                pcm = decode_pcm16(part.audio, f"{where}.audio", event_id, self.limits.max_bytes)
                if not pcm:
                    raise ProtocolError(f"{where}.audio: empty", f"{where}.audio", "invalid_value", event_id)
                parts.append(self._audio_part(pcm))
                content.append({"type": "input_audio", "transcript": part.transcript})
                continue
            text = part.transcript if part.type == "output_audio" else part.text
            if text is None:
                name = "transcript" if part.type == "output_audio" else "text"
                raise ProtocolError(f"{where}.{name}: field required", f"{where}.{name}", "invalid_value", event_id)
            parts.append({"type": "text", "text": text})
            content.append({"type": part.type, ("transcript" if part.type == "output_audio" else "text"): text})
        if not parts:
            raise ProtocolError(
                f"{param}.content: at least one content part", f"{param}.content", "invalid_value", event_id
            )
        return ConversationItem(item.id or new_id("item"), item.role, content, parts)

    def find(self, item_id: str) -> int | None:
        return next((i for i, it in enumerate(self.items) if it.id == item_id), None)

    def insert(self, item: ConversationItem, previous_item_id: str | None, event_id: str | None) -> str | None:
        """Add ``item`` after ``previous_item_id`` ("root": first; None: last); returns its predecessor's id."""
        if previous_item_id is None:
            at = len(self.items)
        elif previous_item_id == "root":
            at = 0
        else:
            index = self.find(previous_item_id)
            if index is None:
                raise ProtocolError(
                    f"previous_item_id: no item {previous_item_id!r} in the conversation",
                    "previous_item_id",
                    "item_not_found",
                    event_id,
                )
            at = index + 1
        self.items.insert(at, item)
        return self.items[at - 1].id if at else None

    def delete(self, item_id: str, event_id: str | None) -> None:
        index = self.find(item_id)
        if index is None:
            raise ProtocolError(
                f"item_id: no item {item_id!r} in the conversation", "item_id", "item_not_found", event_id
            )
        del self.items[index]
