"""POST /v1/audio/generate: text -> audio (sound, music) from a text-to-audio diffusion pipeline.

JSON in (``prompt``, ``negative_prompt``, ``duration`` in seconds, ``seed``, ``num_inference_steps``,
``guidance_scale``, ``response_format``), the encoded clip out (wav / flac / mp3 / pcm, with the encoders of
``/v1/audio/speech``). ``duration`` reaches the pipeline as its ``duration`` parameter; the stage refuses a
length the model cannot make (a 400 naming ``duration``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import ConfigDict, Field

from omnistage.errors import InvalidRequestError
from omnistage.modality import OutputModality
from omnistage.params import RequestKnobs
from omnistage.server.deps import get_state
from omnistage.server.errors import APIError, bad_request, from_engine_error
from omnistage.server.media import AUDIO_MIME, encode_audio
from omnistage.server.middleware import request_id
from omnistage.server.openapi import success
from omnistage.server.state import ServerState

router = APIRouter(prefix="/v1")


class AudioGenerateRequest(RequestKnobs):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"prompt": "rain on a tin roof", "duration": 5.0, "seed": 7, "response_format": "wav"}]
        }
    )

    model: str | None = None
    prompt: str = Field(min_length=1, max_length=32000)
    duration: float | None = Field(None, gt=0, allow_inf_nan=False)  # seconds; None: the model's default length
    response_format: Literal["wav", "flac", "mp3", "pcm"] = "wav"
    extra_body: dict[str, Any] | None = None


@router.post(
    "/audio/generate",
    response_class=Response,
    responses=success("The generated audio", *dict.fromkeys(AUDIO_MIME.values())),
)
async def generate_audio(body: AudioGenerateRequest, request: Request, state: ServerState = Depends(get_state)):
    lora = state.check_model(body.model)
    state.require(OutputModality.AUDIO, "audio")
    nested = dict(body.extra_body or {})
    if body.duration is not None:
        nested["duration"] = body.duration
    knobs = body.knobs(nested)
    if knobs.n not in (None, 1):  # one clip per request: the answer's body is that clip
        raise bad_request(f"n: this route returns one clip per request, got n={knobs.n}", "n")
    prompt: dict[str, Any] = {"prompt": body.prompt}
    if knobs.negative_prompt is not None:
        prompt["negative_prompt"] = knobs.negative_prompt
    try:
        req = state.make_request(prompt, request_id(request.scope), output_modalities=["audio"], knobs=knobs, lora=lora)
        result = await state.run(request, req)
    except InvalidRequestError as e:
        raise from_engine_error(e) from None
    if result.audio is None or not result.sample_rate:
        raise APIError(500, f"pipeline {state.engine.pipeline.name!r} finished without audio", code="no_output")
    data = await asyncio.to_thread(encode_audio, result.audio, result.sample_rate, body.response_format)
    samples = result.audio.shape[-1]
    headers = {
        "X-Sample-Rate": str(result.sample_rate),
        "X-Audio-Channels": str(result.audio.shape[0] if result.audio.ndim == 2 else 1),
        "X-Audio-Duration-S": f"{samples / result.sample_rate:.3f}",
    }
    return Response(data, media_type=AUDIO_MIME[body.response_format], headers=headers)
