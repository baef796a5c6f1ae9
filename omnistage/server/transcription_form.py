"""The multipart form of /v1/audio/transcriptions and /v1/audio/translations as the official client sends it:
every field checked before any model work (each problem a 400 naming it), and the recogniser request of one
audio window (the family turns it into its model's prompt)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import UploadFile

from omnistage.params import RequestKnobs, validation_error
from omnistage.server.errors import bad_request
from omnistage.server.state import ServerState
from omnistage.server.transcripts import FORMATS, LanguagePrefix
from omnistage.speech import Transcription

STREAMABLE = ("json", "text")
TIMESTAMPED = ("verbose_json", "srt", "vtt")  # the formats with segment times (json / text keep one prompt)
GRANULARITIES = ("segment", "word")
_ROUTE_FIELDS = {
    "file",
    "model",
    "language",
    "prompt",
    "response_format",
    "temperature",
    "stream",
    "timestamp_granularities[]",
    "timestamp_granularities",
}
_KNOB_FIELDS = set(RequestKnobs.LLM) | {"max_completion_tokens"}


@dataclass
class TranscriptionForm:
    upload: UploadFile
    task: str
    language: str
    prompt: str = ""
    response_format: str = "json"
    stream: bool = False
    lora: str | None = None
    knobs: RequestKnobs = field(default_factory=RequestKnobs)
    detect_language: bool = False  # no language given and the model can tell it (language is set once detected)
    language_prefix: Mapping[str, Any] | None = None  # no language given: the model names it in its text
    unforced_language: bool = False  # no language given: the prompt names none (Voxtral, as vllm serve prompts it)
    timestamps: Mapping[str, Any] | None = None  # the info's timestamp tokens: segments inside each window

    def prefix(self) -> LanguagePrefix | None:
        """A fresh stripper of the language prefix, per window (None: the language is forced)."""
        return LanguagePrefix(**self.language_prefix) if self.language_prefix else None


def _text_field(form: Any, name: str) -> str | None:
    values = form.getlist(name)
    if not values:
        return None
    if len(values) > 1 or not isinstance(values[0], str):
        raise bad_request(f"{name}: expected one text value", name)
    return values[0]


def parse_form(form: Any, state: ServerState, task: str) -> TranscriptionForm:
    """Every field checked, each problem a 400 naming it (the file itself is read afterwards)."""
    info = state.engine.pipeline.info.transcription
    assert info is not None  # _read_form refused a pipeline that does not recognise speech
    for name in form.keys():
        if name not in _ROUTE_FIELDS and name not in _KNOB_FIELDS:
            raise bad_request(f"{name}: unknown field for /v1/audio/{task}s", name)
    upload = form.get("file")
    if not isinstance(upload, UploadFile) or len(form.getlist("file")) != 1:
        raise bad_request("file: expected one uploaded audio file", "file")
    lora = state.check_model(_text_field(form, "model"))
    fmt = _text_field(form, "response_format") or "json"
    if fmt not in FORMATS:
        raise bad_request(f"response_format: {fmt!r} is not one of {', '.join(FORMATS)}", "response_format")
    language = _text_field(form, "language")
    known = list(info.languages)
    detect = not language and bool(info.language_token_ids)
    prefix = info.language_prefix if not language else None
    unforced = not language and info.unforced_language
    if not language:
        language = info.default_language or (known[0] if known else "en")
    elif language.lower() not in known:
        raise bad_request(
            f"language: {language!r} is not a language this model knows (ISO 639-1 codes such as "
            f"{', '.join(known[:5])})",
            "language",
        )
    if task not in info.tasks:
        raise bad_request(f"model: {state.model_name!r} does not {task}", "model")
    stream_text = (_text_field(form, "stream") or "false").lower()
    if stream_text not in ("true", "false"):
        raise bad_request(f"stream: expected true or false, got {stream_text!r}", "stream")
    stream = stream_text == "true"
    if stream and fmt not in STREAMABLE:
        raise bad_request(
            f"stream: response_format {fmt!r} cannot be streamed (only {', '.join(STREAMABLE)})", "stream"
        )
    _check_granularities(form, fmt)
    knobs = _knobs(form)
    return TranscriptionForm(
        upload=upload,
        task=task,
        language=language.lower(),
        prompt=_text_field(form, "prompt") or "",
        response_format=fmt,
        stream=stream,
        lora=lora,
        knobs=knobs,
        detect_language=detect,
        language_prefix=prefix,
        unforced_language=unforced,
        timestamps=info.timestamps if fmt in TIMESTAMPED else None,
    )


def _check_granularities(form: Any, fmt: str) -> None:
    """``timestamp_granularities``: segments only, and only for verbose_json."""
    granularities = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    for g in granularities:
        if g not in GRANULARITIES:
            raise bad_request(
                f"timestamp_granularities: {g!r} is not one of {', '.join(GRANULARITIES)}", "timestamp_granularities"
            )
        if g == "word":  # (word alignment needs the cross-attention weights, which vLLM's API does not give)
            raise bad_request(
                "timestamp_granularities: word timestamps are not supported (segment only)", "timestamp_granularities"
            )
    if granularities and fmt != "verbose_json":
        raise bad_request("timestamp_granularities: needs response_format verbose_json", "timestamp_granularities")


def _knobs(form: Any) -> RequestKnobs:
    """The llm knobs sent as further fields (the client's ``extra_body``) and ``temperature``, validated."""
    knob_values: dict[str, Any] = {}
    for name in sorted(_KNOB_FIELDS | {"temperature"}):
        values = form.getlist(name)
        if not values:
            continue
        if not all(isinstance(v, str) for v in values):
            raise bad_request(f"{name}: expected text values", name)
        # list-valued knobs may repeat the field (the client's way of sending a list in a form)
        knob_values[name] = values if name == "stop_token_ids" or (name == "stop" and len(values) > 1) else values[0]
    try:
        return RequestKnobs.model_validate(knob_values)
    except ValidationError as e:
        raise validation_error(e) from None


def window_prompt(piece: np.ndarray, rate: int, form: TranscriptionForm) -> dict[str, Any]:
    """The recogniser request for one window (the family turns it into its model's prompt)."""
    language = None if form.language_prefix or form.unforced_language else form.language  # (None: the model's)
    info = Transcription(language=language, task=form.task, timestamps=bool(form.timestamps))
    return {"prompt": form.prompt, "multi_modal_data": {"audio": (piece, rate)}, "transcription": info}


class TranscriptionFields(BaseModel):
    """The text fields of the multipart form (documentation: the route reads the form itself, parse_form)."""

    model: str | None = None
    language: str | None = Field(
        None,
        description="ISO 639-1 code of the spoken language (omitted: detected where "
        "the model can tell it, Whisper, or named by the model, "
        "Qwen3-ASR; else the model's default)",
    )
    prompt: str | None = Field(None, description="text of the previous audio, to steer spelling and style")
    response_format: str = Field("json", description="json | text | srt | vtt | verbose_json")
    temperature: float | None = Field(None, ge=0)
    stream: bool = Field(False, description="SSE transcript.text.delta / transcript.text.done (json, text)")
    max_tokens: int | None = Field(None, ge=1, description="per 30 s window")
    seed: int | None = Field(None, ge=0)
