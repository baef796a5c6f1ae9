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
(server/segments.py, cut as ``vllm serve`` cuts them). Every check happens before model work
(server/transcription_form.py); a stream is server/transcription_stream.py's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from omnistage.media.audio import decode_audio
from omnistage.modality import OutputModality
from omnistage.server.deps import get_state
from omnistage.server.errors import APIError, bad_request, error_responses
from omnistage.server.middleware import request_id
from omnistage.server.openapi import SSE, request_body, success
from omnistage.server.recognition import DEFAULT_MAX_AUDIO_S, NO_SPACE_LANGUAGES, language_of, language_probe, windows
from omnistage.server.segments import tokenizer, window_segments
from omnistage.server.state import ServerState
from omnistage.server.transcription_form import TranscriptionFields, TranscriptionForm, parse_form, window_prompt
from omnistage.server.transcription_stream import Window, stream_transcript
from omnistage.server.transcripts import MEDIA_TYPES, Segment, Transcript

router = APIRouter(prefix="/v1")
logger = logging.getLogger("omnistage.server")


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
        return await stream_transcript(state, reqs, separator, duration, form)
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
