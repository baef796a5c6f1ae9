"""POST /v1/audio/speech (whole or streamed, wav / pcm / flac / mp3, or SSE events) and the voices:
GET /v1/audio/voices, POST /v1/audio/voices (register a cloned voice), DELETE /v1/audio/voices/{name}.

Generic over pipelines: any pipeline whose outputs include audio serves speech; preset voices come from
the pipeline's ``info.speech.voices``, cloned ones from the voice registry (voices.py). Voice cloning
(``ref_audio`` + ``ref_text``, or a registered voice) needs ``info.speech.supports_voice_cloning``; the
clip is fetched and decoded here and reaches the pipeline as ``additional_information.ref_audio``
(``(samples, sample_rate)``) with ``ref_text``; the pipeline's stage validates the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from omnistage.engine.request import OmniRequest
from omnistage.modality import OutputModality
from omnistage.outputs import OmniRequestOutput
from omnistage.server.deps import get_state
from omnistage.server.errors import APIError, bad_request, error_responses, from_engine_error
from omnistage.server.media import (
    AUDIO_MIME,
    AudioStreamEncoder,
    Fetched,
    b64,
    decode_base64,
    encode_audio,
    fetch_media,
    pcm16,
)
from omnistage.server.middleware import request_id
from omnistage.server.openapi import SSE, request_body, success
from omnistage.server.protocol import SpeechRequest
from omnistage.server.state import ServerState
from omnistage.server.streaming import (
    AbortOnDisconnect,
    end_on_error,
    primed,
    sse,
    with_error_event,
)
from omnistage.server.voices import (
    DEFAULT_MAX_REF_AUDIO_S,
    Voice,
    VoiceForm,
    check_name,
    clip_from_bytes,
    registry,
)

router = APIRouter(prefix="/v1")
logger = logging.getLogger("omnistage.server")


def _presets(state: ServerState) -> list[str]:
    return list(state.engine.pipeline.info.speaks.voices)


def _max_ref_s(state: ServerState) -> float:
    return float(state.engine.pipeline.info.speaks.max_ref_audio_s or DEFAULT_MAX_REF_AUDIO_S)


def _require_cloning(state: ServerState, field: str) -> None:
    if not state.engine.pipeline.info.speaks.supports_voice_cloning:
        raise bad_request(
            f"{field}: model {state.model_name!r} cannot clone voices; use one of the voices listed "
            "by /v1/audio/voices",
            field,
        )


# --------------------------------------------------------------------------- voices

_VOICE_FORM = request_body(VoiceForm, {"audio": False}, json_body=False)
_VOICE_FORM["requestBody"]["content"]["multipart/form-data"]["schema"]["required"].append("audio")  # the clip file


@router.get("/audio/voices")
async def voices(state: ServerState = Depends(get_state)) -> dict:
    state.require(OutputModality.AUDIO, "audio")
    presets = _presets(state)
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
    _require_cloning(state, "audio")
    if name in _presets(state):
        raise APIError(409, f"name: {name!r} is a preset voice of this model", param="name", code="voice_exists")
    data = await audio.read(state.media.max_bytes + 1)
    if len(data) > state.media.max_bytes:
        raise APIError(413, f"audio: larger than {state.media.max_bytes} bytes", param="audio", code="file_too_large")
    samples, rate = await asyncio.to_thread(
        clip_from_bytes, data, "audio", _max_ref_s(state), state.media, audio.content_type
    )
    voice = Voice(name=name, text=text, data=data, sample_rate=rate, duration_s=samples.size / rate)
    await registry(state).add(voice)
    return voice.public()


@router.delete("/audio/voices/{name}")
async def delete_voice(name: str, state: ServerState = Depends(get_state)) -> dict:
    state.require(OutputModality.AUDIO, "audio")
    if name in _presets(state):
        raise bad_request(f"name: {name!r} is a preset voice of this model; only cloned voices can be deleted", "name")
    if not await registry(state).delete(name):
        raise APIError(404, f"no cloned voice named {name!r}", param="name", code="voice_not_found")
    return {"id": name, "object": "voice", "deleted": True}


# --------------------------------------------------------------------------- speech


async def _reference_clip(state: ServerState, ref: str) -> tuple[np.ndarray, int]:
    """``ref_audio`` as a URL (data:, http(s)://, file://) or a bare base64 string -> (samples, rate)."""
    scheme = ref.split(":", 1)[0].lower() if ":" in ref[:16] else ""
    if scheme in ("data", "http", "https", "file"):
        got = await fetch_media(ref, "ref_audio", state.media)  # with the type the URL or response declares
    else:
        got = Fetched(decode_base64(ref, "ref_audio", state.media), None)
    return await asyncio.to_thread(clip_from_bytes, got.data, "ref_audio", _max_ref_s(state), state.media, got.mime)


async def _speaker(state: ServerState, body: SpeechRequest) -> dict[str, Any]:
    """The voice part of ``additional_information``: a preset ``voice``, or a cloned voice's clip + text."""
    if body.ref_audio is not None:
        _require_cloning(state, "ref_audio")
        if body.voice is not None:
            raise bad_request("voice: give a voice or a reference clip (ref_audio), not both", "voice")
        return {"ref_audio": await _reference_clip(state, body.ref_audio), "ref_text": body.ref_text}
    if body.voice is None:
        return {"ref_text": body.ref_text} if body.ref_text is not None else {}
    presets = _presets(state)
    if state.engine.pipeline.info.speaks.voices_case_insensitive:  # e.g. Qwen3-TTS's speakers, as its package
        preset = next((p for p in presets if p.lower() == body.voice.lower()), None)
    else:
        preset = body.voice if body.voice in presets else None
    if preset is not None:
        return {"voice": preset, "ref_text": body.ref_text}
    voice = await registry(state).get(body.voice)
    if voice is not None:
        if body.ref_text is not None:
            raise bad_request("ref_text: a registered voice brings its own transcript", "ref_text")
        return {"ref_audio": await asyncio.to_thread(voice.samples), "ref_text": voice.text}
    known = presets + [v.name for v in await registry(state).list()]
    if known:
        raise bad_request(f"voice: {body.voice!r} is not one of {', '.join(known)}", "voice")
    return {"voice": body.voice}  # no voices listed at all: the pipeline decides


async def speech_information(state: ServerState, body: SpeechRequest) -> dict[str, Any]:
    """The request's ``additional_information`` for a speech family: voice or clone, instructions, language,
    ... (the speech route's fields; chat turns to a speech family take the same ones from ``extra_body``)."""
    info = {
        **await _speaker(state, body),
        "speed": body.speed if body.speed != 1.0 else None,
        "instructions": body.instructions,
        "language": body.language,
        "initial_codec_chunk_frames": body.initial_codec_chunk_frames,
        "x_vector_only_mode": body.x_vector_only_mode,
    }
    return {k: v for k, v in info.items() if v is not None}


async def build_speech_request(state: ServerState, body: SpeechRequest, rid: str) -> OmniRequest:
    """A speech body as the engine's request, every check before model work (also /v1/realtime's path)."""
    lora = state.check_model(body.model)
    state.require(OutputModality.AUDIO, "audio")
    if body.speed != 1.0 and not state.engine.pipeline.info.speaks.supports_speed:
        raise bad_request(f"speed: model {state.model_name!r} does not support changing the speed", "speed")
    if body.stream and body.stream_format == "audio" and body.return_stage_metrics:
        raise bad_request(
            "return_stage_metrics: a raw audio stream has no place for them; set stream_format to 'sse' "
            "(they come in the speech.audio.done event)",
            "return_stage_metrics",
        )
    nested = dict(body.extra_body or {})
    if body.max_new_tokens is not None:
        nested["max_tokens"] = body.max_new_tokens
    knobs = body.knobs(nested)
    prompt: dict[str, Any] = {"prompt": body.input}
    extra_info = await speech_information(state, body)
    if extra_info:
        prompt["additional_information"] = extra_info
    return state.make_request(
        prompt, rid, body.sampling_params_list, output_modalities=["audio"], knobs=knobs, lora=lora
    )


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
