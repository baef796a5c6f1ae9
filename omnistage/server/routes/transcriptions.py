"""POST /v1/audio/transcriptions and /v1/audio/translations (OpenAI-compatible, multipart as the official
client sends them).

Fields: ``file`` (any audio PyAV decodes), ``model``, ``language`` (ISO 639-1; the source language for a
translation; omitted, it is detected on the first window where the pipeline's info lists
``language_token_ids`` (Whisper), or left to a model that names it before each window's transcript where the
info has a ``language_prefix`` (Qwen3-ASR; the prefix is stripped, as ``vllm serve`` strips it), or left out of
the prompt where it has ``unforced_language`` (Voxtral, as ``vllm serve`` prompts it)), ``prompt``
(previous text, to steer spelling and style), ``response_format`` = json | text | srt | vtt | verbose_json,
``temperature``, ``timestamp_granularities[]`` (``segment``), ``stream`` (SSE ``transcript.text.delta`` /
``transcript.text.done`` events, for json and text), and the llm knobs (``max_tokens``, ``seed``, ``top_p``, ...)
as further fields (the client's ``extra_body``).

Generic over pipelines: any pipeline whose ``info.transcription`` (omnistage.info.RecognizerInfo) says how to
feed it (``sample_rate``, ``window_s``, ``languages``, ``tasks``) serves these routes. The audio is decoded and resampled here, cut
into the model's windows (Whisper: 30 s, cut in the quietest 0.1 s of each window's last second, as
``vllm serve`` cuts), and each window becomes one engine request of the recogniser
shape (``prompt`` + ``multi_modal_data.audio`` + ``transcription`` language/task, see
omnistage/models/shared/whisper/prompt.py); the windows run concurrently (the llm stage batches them) and their
texts are joined in order, each window one segment from its offset. Where the info has ``timestamps``
(Whisper), verbose_json / srt / vtt ask each window for timestamp tokens instead (``Transcription.timestamps``:
the family's prompt and timestamp rules; ``logprobs``: 1) and give the segments they mark
(server/segments.py, cut as ``vllm serve`` cuts them). Every check happens before model work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import UploadFile

from omnistage.engine.request import OmniRequest
from omnistage.media.audio import decode_audio
from omnistage.modality import OutputModality
from omnistage.params import RequestKnobs, validation_error
from omnistage.server.deps import get_state
from omnistage.server.errors import APIError, bad_request, error_responses, from_engine_error
from omnistage.server.middleware import request_id
from omnistage.server.openapi import SSE, request_body, success
from omnistage.server.recognition import DEFAULT_MAX_AUDIO_S, NO_SPACE_LANGUAGES, language_of, language_probe, windows
from omnistage.server.segments import tokenizer, window_segments
from omnistage.server.state import ServerState
from omnistage.server.streaming import AbortOnDisconnect, primed, sse, with_error_event
from omnistage.server.transcripts import FORMATS, MEDIA_TYPES, LanguagePrefix, Segment, Transcript
from omnistage.speech import Transcription

router = APIRouter(prefix="/v1")
logger = logging.getLogger("omnistage.server")

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
        knobs = RequestKnobs.model_validate(knob_values)
    except ValidationError as e:
        raise validation_error(e) from None
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


def window_prompt(piece: np.ndarray, rate: int, form: TranscriptionForm) -> dict[str, Any]:
    """The recogniser request for one window (the family turns it into its model's prompt)."""
    language = None if form.language_prefix or form.unforced_language else form.language  # (None: the model's)
    info = Transcription(language=language, task=form.task, timestamps=bool(form.timestamps))
    return {"prompt": form.prompt, "multi_modal_data": {"audio": (piece, rate)}, "transcription": info}


async def _read_form(request: Request, task: str, state: ServerState) -> TranscriptionForm:
    if state.engine.pipeline.info.transcription is None:
        raise bad_request(
            f"model: {state.model_name!r} (pipeline {state.engine.pipeline.name!r}) does not recognise speech", "model"
        )
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError(
            415, "Content-Type must be multipart/form-data (fields file, model, ...)", code="unsupported_media_type"
        )
    return parse_form(await request.form(max_files=1, max_fields=64), state, task)


Window = tuple[float, float, OmniRequest]  # (start s, end s, the window's engine request)


async def _detect_language(
    state: ServerState, request: Request, piece: np.ndarray, rate: int, form: TranscriptionForm, rid: str
) -> str:
    ids = state.engine.pipeline.info.transcription.language_token_ids
    prompt, params = language_probe(piece, rate, ids)
    req = state.make_request(
        prompt, f"{rid}-language", [params], output_modalities=["text", "token_ids"], lora=form.lora
    )
    chosen: list[int] = []

    def keep(out: Any) -> None:
        if out.finished and out.token_ids:
            chosen[:] = out.token_ids

    await state.run(request, req, on_output=keep)
    return language_of(chosen, ids)


async def _requests(
    state: ServerState, request: Request, form: TranscriptionForm, rid: str
) -> tuple[list[Window], float]:
    """The engine requests of an upload, one per window, each checked; and the audio's duration. A form
    without a language gets the detected one first (``form.language``)."""
    info = state.engine.pipeline.info.transcription
    rate = info.sample_rate
    data = await form.upload.read(state.media.max_bytes + 1)
    if len(data) > state.media.max_bytes:
        raise APIError(413, f"file: larger than {state.media.max_bytes} bytes", param="file", code="file_too_large")
    max_s = float(info.max_audio_s or DEFAULT_MAX_AUDIO_S)
    samples = await asyncio.to_thread(decode_audio, data, "file", rate, max_s, state.media, form.upload.content_type)
    out = []
    pieces = windows(samples, rate, float(info.window_s))
    if form.detect_language:
        form.language = await _detect_language(state, request, pieces[0][1], rate, form, rid)
    # timestamps: the sampled tokens' log-probabilities too (each segment's avg_logprob)
    params = (
        [{"logprobs": 1} if s.kind == "llm" else None for s in state.engine.pipeline.stages]
        if form.timestamps
        else None
    )
    # text (and its ids, for verbose_json, where the pipeline gives them) only: an omni recogniser's talker never
    # runs for a transcript
    wanted = ["text", "token_ids"] if OutputModality.TOKEN_IDS in state.engine.output_modalities else ["text"]
    for k, (offset, piece) in enumerate(pieces):
        req = state.make_request(
            window_prompt(piece, rate, form),
            rid if len(pieces) == 1 else f"{rid}-w{k}",
            params,
            output_modalities=wanted,
            knobs=form.knobs,
            lora=form.lora,
        )
        out.append((offset, offset + piece.size / rate, req))
    return out, samples.size / rate


async def _handle(request: Request, state: ServerState, task: str) -> Response:
    form = await _read_form(request, task, state)
    reqs, duration = await _requests(state, request, form, request_id(request.scope))
    separator = "" if form.language in NO_SPACE_LANGUAGES else " "
    if form.stream:
        return await _stream(state, reqs, separator, duration, form)
    tokens: dict[str, list[int]] = {}
    logprobs: dict[str, list[float]] = {}

    def keep_ids(out: Any) -> None:
        if out.delta.get("logprobs"):  # (the stage streams them; its final output has the typed fields only)
            logprobs.setdefault(out.request_id, []).extend(out.delta["logprobs"])
        if out.finished and out.token_ids:
            tokens[out.request_id] = list(out.token_ids)

    if len(reqs) == 1:  # (no task around the one window: a task per request costs the loop under load)
        results = [await state.run(request, reqs[0][2], on_output=keep_ids)]
    else:
        tasks = [asyncio.create_task(state.run(request, req, on_output=keep_ids)) for _, _, req in reqs]
        try:
            results = await asyncio.gather(*tasks)
        finally:
            for t in tasks:  # one window failed (or the client left): the others stop too
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    temperature = form.knobs.temperature or 0.0
    tok = await asyncio.to_thread(tokenizer, form.timestamps["tokenizer"]) if form.timestamps else None
    segments, named = [], []
    for (start, end, req), r in zip(reqs, results):
        text, prefix = r.text or "", form.prefix()
        if prefix is not None:
            text = prefix.feed(text, finished=True)
            named.append(prefix.language())
        ids = tokens.get(req.request_id, [])
        if tok is not None:
            segments += window_segments(
                ids,
                logprobs.get(req.request_id),
                start,
                end,
                text,
                form.timestamps,
                tok.decode,
                tok.eos_token_id,
                seek=int(round(start * 100)),
            )
        else:
            segments.append(Segment(start, end, text, ids))
    language = next((n for n in named if n), form.language)  # the first window's named language, if any
    transcript = Transcript(
        task=task, language=language, duration=duration, segments=segments, temperature=temperature, separator=separator
    )
    body = transcript.render(form.response_format)
    if isinstance(body, dict):
        return JSONResponse(body)
    return PlainTextResponse(body, media_type=MEDIA_TYPES[form.response_format])


async def _stream(
    state: ServerState, reqs: list[Window], separator: str, duration: float, form: TranscriptionForm
) -> Response:
    """Every window starts at once; their text deltas go out in window order."""
    queues: list[asyncio.Queue] = [asyncio.Queue() for _ in reqs]
    _END = object()
    slots = []
    try:
        for _ in reqs:
            slots.append(state.admission.acquire())
    except BaseException:
        for s in slots:
            s.release()
        raise

    async def pump(k: int) -> None:
        prefix = form.prefix()
        try:
            async for out in state.stream(reqs[k][2], slot=slots[k]):
                text = out.delta.get("text")
                if text and prefix is not None:
                    text = prefix.feed(text)
                if text:
                    await queues[k].put(text)
            if prefix is not None and (rest := prefix.feed("", finished=True)):  # held back as a possible prefix
                await queues[k].put(rest)
            await queues[k].put(_END)
        except BaseException as e:  # handed to the reader, which raises it in order
            await queues[k].put(e)
            if isinstance(e, asyncio.CancelledError):
                raise

    pumps = [asyncio.create_task(pump(k)) for k in range(len(reqs))]

    async def events() -> AsyncIterator[str]:
        parts: list[str] = []
        try:
            for k, queue in enumerate(queues):
                pending = separator if k else ""  # goes out with the window's first text (or alone, if none)
                while (item := await queue.get()) is not _END:
                    if isinstance(item, BaseException):
                        raise item
                    item, pending = pending + item, ""
                    parts.append(item)
                    yield sse({"type": "transcript.text.delta", "delta": item, "logprobs": None})
                if pending:  # the joined text is the non-streamed one, empty windows included
                    parts.append(pending)
                    yield sse({"type": "transcript.text.delta", "delta": pending, "logprobs": None})
            yield sse(
                {
                    "type": "transcript.text.done",
                    "text": "".join(parts),
                    "logprobs": None,
                    "usage": {"type": "duration", "seconds": round(duration, 3)},
                }
            )
        finally:
            for p in pumps:
                p.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for s in slots:
                s.release()

    try:
        chunks = await primed(events())  # what the stage refuses at once is still a proper 400
    except BaseException:
        for p in pumps:
            p.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for s in slots:
            s.release()
        raise
    return AbortOnDisconnect(
        with_error_event(chunks, from_engine_error),
        headers={"Cache-Control": "no-cache"},
        media_type="text/event-stream",
    )


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


_FORM = request_body(TranscriptionFields, {"file": False}, json_body=False)
_FORM["requestBody"]["content"]["multipart/form-data"]["schema"].setdefault("required", []).append("file")

# JSON (json, verbose_json) as FastAPI documents it; the text formats and the stream beside it
_RESPONSES = success(
    "The transcript", *dict.fromkeys(m for m in MEDIA_TYPES.values() if m != "application/json"), SSE, json=True
)


@router.post("/audio/transcriptions", responses={**_RESPONSES, **error_responses(413, 415)}, openapi_extra=_FORM)
async def transcriptions(request: Request, state: ServerState = Depends(get_state)) -> Response:
    """Speech to text in the spoken language (multipart: file, model, language, prompt, response_format, ...)."""
    return await _handle(request, state, "transcribe")


@router.post("/audio/translations", responses={**_RESPONSES, **error_responses(413, 415)}, openapi_extra=_FORM)
async def translations(request: Request, state: ServerState = Depends(get_state)) -> Response:
    """Speech to English text (multipart: file, model, prompt, response_format, ...)."""
    return await _handle(request, state, "translate")
