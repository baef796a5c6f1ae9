"""POST /v1/audio/speech (whole or streamed, wav / pcm / flac / mp3, or SSE events) and the voices:
GET /v1/audio/voices, POST /v1/audio/voices (register a cloned voice), DELETE /v1/audio/voices/{name}.

Generic over pipelines: any pipeline whose outputs include audio serves speech; preset voices come from
the pipeline's ``info.speech.voices``, cloned ones from the voice registry (voices.py). Voice cloning
(``ref_audio`` + ``ref_text``, or a registered voice) needs ``info.speech.supports_voice_cloning``; the
clip is fetched and decoded here and reaches the pipeline as the speech input's ``ref_audio``
(``(samples, sample_rate)``) with ``ref_text``; the pipeline's stage validates the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from omnistage.modality import OutputModality
from omnistage.outputs import OmniRequestOutput
from omnistage.server.deps import get_state
from omnistage.server.errors import APIError, bad_request, error_responses, from_engine_error
from omnistage.server.media import (
    AUDIO_MIME,
    AudioStreamEncoder,
    b64,
    encode_audio,
    pcm16,
)
from omnistage.server.middleware import request_id
from omnistage.server.openapi import SSE, request_body, success
from omnistage.server.protocol import SpeechRequest
from omnistage.server.speech_request import build_speech_request, max_ref_s, preset_voices, require_cloning
from omnistage.server.state import ServerState
from omnistage.server.streaming import (
    AbortOnDisconnect,
    end_on_error,
    primed,
    sse,
    with_error_event,
)
from omnistage.server.voices import (
    Voice,
    VoiceForm,
    check_name,
    clip_from_bytes,
    registry,
)

router = APIRouter(prefix="/v1")
logger = logging.getLogger("omnistage.server")


# --------------------------------------------------------------------------- voices

_VOICE_FORM = request_body(VoiceForm, {"audio": False}, json_body=False)
_VOICE_FORM["requestBody"]["content"]["multipart/form-data"]["schema"]["required"].append("audio")  # the clip file


@router.get("/audio/voices")
async def voices(state: ServerState = Depends(get_state)) -> dict:
    state.require(OutputModality.AUDIO, "audio")
    presets = preset_voices(state)
    cloned = await registry(state).list()
    data = [{"id": v, "object": "voice", "name": v, "type": "preset"} for v in presets] + [v.public() for v in cloned]
    return {"object": "list", "model": state.model_name, "voices": presets + [v.name for v in cloned], "data": data}


@router.post("/audio/voices", responses=error_responses(409, 413, 415), openapi_extra=_VOICE_FORM)
async def add_voice(request: Request, state: ServerState = Depends(get_state)) -> dict:
    """Register a cloned voice (multipart: ``name``, ``audio`` file, ``text`` = the clip's transcript)."""
    state.require(OutputModality.AUDIO, "audio")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError(
            415, "Content-Type must be multipart/form-data (fields name, audio, text)", code="unsupported_media_type"
        )
    form = await request.form(max_files=1, max_fields=10)
    audio = form.get("audio")
    if not isinstance(audio, UploadFile):
        raise bad_request("audio: expected a file upload (the reference clip)", "audio")
    name = check_name(form.get("name"))
    text = form.get("text")
    if not isinstance(text, str) or not text.strip():
        raise bad_request("text: the transcript of the clip is required", "text")
    require_cloning(state, "audio")
    if name in preset_voices(state):
        raise APIError(409, f"name: {name!r} is a preset voice of this model", param="name", code="voice_exists")
    data = await audio.read(state.media.max_bytes + 1)
    if len(data) > state.media.max_bytes:
        raise APIError(413, f"audio: larger than {state.media.max_bytes} bytes", param="audio", code="file_too_large")
    samples, rate = await asyncio.to_thread(
        clip_from_bytes, data, "audio", max_ref_s(state), state.media, audio.content_type
    )
    voice = Voice(name=name, text=text, data=data, sample_rate=rate, duration_s=samples.size / rate)
    await registry(state).add(voice)
    return voice.public()


@router.delete("/audio/voices/{name}")
async def delete_voice(name: str, state: ServerState = Depends(get_state)) -> dict:
    state.require(OutputModality.AUDIO, "audio")
    if name in preset_voices(state):
        raise bad_request(f"name: {name!r} is a preset voice of this model; only cloned voices can be deleted", "name")
    if not await registry(state).delete(name):
        raise APIError(404, f"no cloned voice named {name!r}", param="name", code="voice_not_found")
    return {"id": name, "object": "voice", "deleted": True}


# --------------------------------------------------------------------------- speech


@router.post(
    "/audio/speech",
    response_class=Response,
    responses={
        **success(
            "The speech (streamed: the same format, sent as it is decoded; SSE events of "
            "base64 PCM16 with stream_format=sse)",
            *dict.fromkeys(AUDIO_MIME.values()),
            SSE,
        ),
        **error_responses(413, 415),
    },
)  # ref_audio over the upload limit / of another type
async def speech(body: SpeechRequest, request: Request, state: ServerState = Depends(get_state)) -> Response:
    rate = state.engine.pipeline.info.speaks.sample_rate
    req = await build_speech_request(state, body, request_id(request.scope))
    if body.stream:
        slot = state.admission.acquire()
        try:
            outs = await primed(state.stream(req, slot=slot))  # what the stage refuses at once is a 400
        except BaseException:
            slot.release()
            raise
        sse_mode = body.stream_format == "sse"
        headers = {"Cache-Control": "no-cache"}
        if rate:
            headers["X-Sample-Rate"] = str(rate)
        if sse_mode:
            chunks = with_error_event(_sse_events(state, outs, body.return_stage_metrics), from_engine_error)
        else:
            chunks = end_on_error(_encoded(state, outs, body.response_format, rate), logger)
        return AbortOnDisconnect(
            chunks,
            on_close=slot.release,
            headers=headers,
            media_type="text/event-stream" if sse_mode else AUDIO_MIME[body.response_format],
        )
    result = await state.run(request, req)
    if result.audio is None or not result.sample_rate:
        raise APIError(500, f"pipeline {state.engine.pipeline.name!r} finished without audio", code="no_output")
    data = await asyncio.to_thread(encode_audio, result.audio, result.sample_rate, body.response_format)
    headers = {
        "X-Sample-Rate": str(result.sample_rate),
        "X-Audio-Duration-S": f"{len(result.audio) / result.sample_rate:.3f}",
    }
    if body.return_stage_metrics:
        # the body is the audio itself: metrics travel as compact JSON in a header
        headers["X-Stage-Metrics"] = json.dumps({str(k): v for k, v in result.metrics.items()}, separators=(",", ":"))
    return Response(data, media_type=AUDIO_MIME[body.response_format], headers=headers)


async def _audio_deltas(
    outs: AsyncIterator[OmniRequestOutput],
) -> AsyncIterator[tuple[np.ndarray, int | None, OmniRequestOutput]]:
    """Each non-empty audio delta as float32 mono, with its sample rate (and the output it came in)."""
    async for out in outs:
        audio = out.delta.get("audio")
        arr = None
        if audio is not None:
            arr = np.asarray(audio.detach().cpu() if hasattr(audio, "detach") else audio, dtype=np.float32).reshape(-1)
        yield arr if arr is not None and arr.size else None, out.sample_rate or out.delta.get("sample_rate"), out


async def _encoded(state: ServerState, outs: AsyncIterator[OmniRequestOutput], fmt: str, rate: int | None):
    """The body of a streamed response: each decoded chunk encoded as soon as it arrives."""
    encoder: AudioStreamEncoder | None = None
    seconds = 0.0
    async for arr, sample_rate, _ in _audio_deltas(outs):
        if arr is None:
            continue
        rate = sample_rate or rate
        if rate is None:
            raise RuntimeError("the pipeline sent audio without a sample rate")
        if encoder is None:
            encoder = await asyncio.to_thread(AudioStreamEncoder, fmt, rate)
        seconds += arr.size / float(rate)
        data = encoder.encode(arr) if fmt in ("pcm", "wav") else await asyncio.to_thread(encoder.encode, arr)
        if data:
            yield data
    state.metrics.audio_seconds.inc(seconds)
    if encoder is not None:
        tail = await asyncio.to_thread(encoder.close)
        if tail:
            yield tail


async def _sse_events(state: ServerState, outs: AsyncIterator[OmniRequestOutput], with_metrics: bool):
    seconds, sample_rate = 0.0, None
    metrics: dict[int, dict[str, float]] = {}
    async for arr, rate, out in _audio_deltas(outs):
        if out.finished:
            metrics.update(out.metrics or {})
        if arr is None:
            continue
        sample_rate = rate or sample_rate
        seconds += arr.size / float(sample_rate or 1)
        yield sse({"type": "speech.audio.delta", "audio": b64(pcm16(arr)), "sample_rate": sample_rate})
    state.metrics.audio_seconds.inc(seconds)
    done = {"type": "speech.audio.done", "sample_rate": sample_rate, "audio_duration_s": round(seconds, 3)}
    if with_metrics:
        done["stage_metrics"] = {str(k): v for k, v in metrics.items()}
    yield sse(done)
