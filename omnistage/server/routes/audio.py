"""POST /v1/audio/speech (+ streamed PCM) and GET /v1/audio/voices.

Generic over pipelines: any pipeline whose outputs include audio serves
speech; voices come from the pipeline's ``info["voices"]``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from omnistage.modality import OutputModality
from omnistage.server.app import get_state
from omnistage.server.errors import APIError, bad_request, from_engine_error
from omnistage.server.media import AUDIO_MIME, b64, encode_audio, pcm16
from omnistage.server.middleware import request_id
from omnistage.server.protocol import SpeechRequest
from omnistage.server.sampling import build_sampling_params_list, request_knobs
from omnistage.server.state import ServerState
from omnistage.server.streaming import AbortOnDisconnect, end_on_error, sse, with_error_event

router = APIRouter(prefix="/v1")
logger = logging.getLogger("omnistage.server")


def _voices(state: ServerState) -> list[str]:
    return list(state.engine.pipeline.info.get("voices") or [])


@router.get("/audio/voices")
async def voices(state: ServerState = Depends(get_state)) -> dict:
    state.require(OutputModality.AUDIO, "audio")
    names = _voices(state)
    return {"object": "list", "model": state.model_name, "voices": names,
            "data": [{"id": v, "object": "voice"} for v in names]}


@router.post("/audio/speech")
async def speech(body: SpeechRequest, request: Request, state: ServerState = Depends(get_state)) -> Response:
    state.check_model(body.model)
    state.require(OutputModality.AUDIO, "audio")
    info = state.engine.pipeline.info
    names = _voices(state)
    if body.voice is not None and names and body.voice not in names:
        raise bad_request(f"voice: {body.voice!r} is not one of {', '.join(names)}", "voice")
    if body.speed != 1.0 and not info.get("supports_speed"):
        raise bad_request(f"speed: model {state.model_name!r} does not support changing the speed", "speed")
    if body.stream and body.stream_format == "audio" and body.response_format != "pcm":
        raise bad_request("response_format: a streamed response sends raw 16-bit PCM; set response_format to 'pcm' "
                          "(or stream_format to 'sse')", "response_format")
    knobs, extras = request_knobs(body)
    params = build_sampling_params_list(state.engine, knobs, extras)
    extra_info = {k: v for k, v in {"voice": body.voice, "speed": body.speed if body.speed != 1.0 else None,
                                   "instructions": body.instructions}.items() if v is not None}
    prompt: dict[str, Any] = {"prompt": body.input}
    if extra_info:
        prompt["additional_information"] = extra_info
    rid = request_id(request.scope)
    if body.stream:
        slot = state.admission.acquire()
        sse_mode = body.stream_format == "sse"
        chunks = _stream(state, rid, prompt, params, slot, sse_mode)
        headers = {"Cache-Control": "no-cache"}
        if info.get("sample_rate"):
            headers["X-Sample-Rate"] = str(info["sample_rate"])
        chunks = with_error_event(chunks, from_engine_error) if sse_mode else end_on_error(chunks, logger)
        return AbortOnDisconnect(chunks, on_close=slot.release, headers=headers,
                                 media_type="text/event-stream" if sse_mode else AUDIO_MIME["pcm"])
    result = await state.run(request, rid, prompt, params, ["audio"])
    if result.audio is None or not result.sample_rate:
        raise APIError(500, f"pipeline {state.engine.pipeline.name!r} finished without audio", code="no_output")
    data = await asyncio.to_thread(encode_audio, result.audio, result.sample_rate, body.response_format)
    return Response(data, media_type=AUDIO_MIME[body.response_format],
                    headers={"X-Sample-Rate": str(result.sample_rate),
                             "X-Audio-Duration-S": f"{len(result.audio) / result.sample_rate:.3f}"})


async def _stream(state: ServerState, rid: str, prompt: dict, params: list, slot: Any, sse_mode: bool):
    seconds, sample_rate = 0.0, None
    async for out in state.stream(rid, prompt, params, ["audio"], slot=slot):
        audio = out.delta.get("audio")
        if audio is None:
            continue
        arr = np.asarray(audio.detach().cpu() if hasattr(audio, "detach") else audio, dtype=np.float32).reshape(-1)
        if not arr.size:
            continue
        sample_rate = out.sample_rate or out.delta.get("sample_rate") or sample_rate
        seconds += arr.size / float(sample_rate or 1)
        data = pcm16(arr)
        yield sse({"type": "speech.audio.delta", "audio": b64(data), "sample_rate": sample_rate}) if sse_mode else data
    state.metrics.audio_seconds.inc(seconds)
    if sse_mode:
        yield sse({"type": "speech.audio.done", "sample_rate": sample_rate, "audio_duration_s": round(seconds, 3)})
