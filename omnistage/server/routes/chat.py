"""POST /v1/chat/completions: OpenAI chat with multimodal content parts in and
text / image / audio / video out, optionally streamed (SSE)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request, Response

from omnistage.engine.request import OmniRequest
from omnistage.outputs import OmniRequestOutput
from omnistage.server.audio_delta import audio_delta
from omnistage.server.chat_request import build_chat_request, text_hidden
from omnistage.server.deps import get_state
from omnistage.server.errors import error_responses, from_engine_error
from omnistage.server.media import (
    b64,
    data_url,
    encode_audio,
    encode_image,
    encode_mp4,
    pcm16,
)
from omnistage.server.middleware import request_id
from omnistage.server.openapi import SSE, success
from omnistage.server.prompt_warnings import drawn_size, prompt_warnings, warning_headers
from omnistage.server.protocol import ChatCompletionRequest
from omnistage.server.result import Result, action_fields
from omnistage.server.state import ServerState
from omnistage.server.streaming import (
    SSE_DONE,
    AbortOnDisconnect,
    primed,
    sse,
    with_error_event,
)

router = APIRouter(prefix="/v1")


# JSON, or SSE with stream; a media part over the decode limits is a 413, one of the wrong declared type a 415
@router.post("/chat/completions", responses={**success("", SSE, json=True), **error_responses(413, 415)})
async def chat_completions(
    body: ChatCompletionRequest, request: Request, response: Response, state: ServerState = Depends(get_state)
) -> Any:
    req = await build_chat_request(state, body, request_id(request.scope), transcript=True)
    # what the request asked that is ignored (a stage's unused sampling params), and words a closed-vocabulary
    # model (the demo) cannot draw: a header on either answer, a field on the JSON one
    info, size = state.engine.pipeline.info, drawn_size(req.sampling_params)
    warnings = [*req.warnings, *prompt_warnings(info, state.model_name, req.prompt.get("prompt"), size)]
    if body.stream:
        slot = state.admission.acquire()  # before the response starts, so saturation is a real 503
        try:
            outs = await primed(state.stream(req, slot=slot))
        except BaseException:
            slot.release()
            raise
        events = _stream(state, body, req, outs)
        streamed = AbortOnDisconnect(
            with_error_event(events, from_engine_error),
            on_close=slot.release,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        for name, value in warning_headers(warnings):  # one header per warning (a dict would keep the last)
            streamed.headers.append(name, value)
        return streamed
    result = await state.run(request, req)
    out = await asyncio.to_thread(_completion, state, body, req.request_id, result)
    if warnings:
        out["warnings"] = warnings
        for name, value in warning_headers(warnings):
            response.headers.append(name, value)
    return out


# --------------------------------------------------------------------------- responses


def _image_part(image: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(encode_image(image, "png"), "image/png")}}


def _video_part(
    video: np.ndarray, fps: float | None, audio: np.ndarray | None = None, sample_rate: int | None = None
) -> dict[str, Any]:
    """The video as an MP4 ``video_url`` part; with the request's audio (a video+audio stage) as its soundtrack."""
    mp4 = encode_mp4(video, fps or 8, audio, sample_rate)
    return {"type": "video_url", "video_url": {"url": data_url(mp4, "video/mp4")}}


def _usage(result: Result) -> dict[str, Any]:
    return result.usage()


def _finish_reason(reason: str | None) -> str:
    return reason if reason in ("stop", "length") else "stop"


def _completion(state: ServerState, body: ChatCompletionRequest, rid: str, result: Result) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    parts = [_image_part(im) for im in result.images]
    if result.video is not None:
        parts.append(_video_part(result.video, result.fps, result.audio, result.sample_rate))
    if parts:
        message["content"] = ([{"type": "text", "text": result.text}] if result.text else []) + parts
    else:
        message["content"] = result.text if result.text is not None else ("" if result.audio is None else None)
    if text_hidden(state, body):  # the text is the speech's transcript only
        message["content"] = None
    message.update(result.action_json() or {})  # a world model's actions: actions, action_domain, action_fps
    if result.audio is not None:
        message["audio"] = {
            "id": f"audio-{rid}",
            "data": b64(encode_audio(result.audio, result.sample_rate or 24000, "wav")),
            "format": "wav",
            "sample_rate": result.sample_rate,
            "expires_at": int(time.time()) + 3600,
            "transcript": result.text or "",
        }
    out = {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": [
            {"index": 0, "message": message, "finish_reason": _finish_reason(result.finish_reason), "logprobs": None}
        ],
        "usage": _usage(result),
    }
    if body.return_stage_metrics:
        out["stage_metrics"] = {str(k): v for k, v in result.metrics.items()}
    return out


async def _stream(
    state: ServerState, body: ChatCompletionRequest, req: OmniRequest, outs: AsyncIterator[OmniRequestOutput]
):
    rid = req.request_id
    created = int(time.time())
    start = time.monotonic()
    first = True
    result = Result()
    text_stages = state.text_stages()
    hidden = text_hidden(state, body)
    continuous = (
        body.stream_options is not None
        and body.stream_options.include_usage
        and body.stream_options.continuous_usage_stats
    )

    def chunk(delta: dict[str, Any], modality: str | None, finish: str | None = None, **extra: Any) -> str:
        data = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": state.model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            **extra,
        }
        if modality is not None:
            data["modality"] = modality
        return sse(data)

    yield chunk({"role": "assistant", "content": ""}, "text")
    rate_sent = False
    async for out in outs:
        pieces: list[str] = []
        text = out.delta.get("text")
        if isinstance(text, str) and text and hidden:  # speech without text: the transcript, as OpenAI streams it
            pieces.append(chunk({"audio": {"id": f"audio-{rid}", "transcript": text}}, "audio"))
        elif isinstance(text, str) and text:
            usage = {}
            if continuous and out.num_tokens is not None:  # the server's count, so clients need not count chunks
                prompt_tokens = out.num_prompt_tokens or 0
                usage = {
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": out.num_tokens,
                        "total_tokens": prompt_tokens + out.num_tokens,
                    }
                }
            pieces.append(chunk({"content": text}, "text", **usage))
        arr = audio_delta(out)
        if arr is not None:
            delta = {"id": f"audio-{rid}", "data": b64(pcm16(arr)), "format": "pcm16"}
            if not rate_sent:  # the sample rate once, with the first audio delta
                delta["sample_rate"] = out.sample_rate or out.delta.get("sample_rate")
                rate_sent = True
            pieces.append(chunk({"audio": delta}, "audio"))
        if out.finished:
            result.add(out, text_stages)
            if out.audio is not None and not rate_sent:  # a stage that streams no audio (LTX-2's soundtrack)
                pieces.append(
                    chunk(
                        {
                            "audio": {
                                "id": f"audio-{rid}",
                                "data": b64(pcm16(out.audio)),
                                "format": "pcm16",
                                "sample_rate": out.sample_rate,
                                "channels": 2 if out.audio.ndim == 2 else 1,
                            }
                        },
                        "audio",
                    )
                )
                rate_sent = True
            for image in out.images:
                pieces.append(chunk({"content": [await asyncio.to_thread(_image_part, image)]}, "image"))
            if out.video is not None:
                part = await asyncio.to_thread(_video_part, out.video, out.fps, out.audio, out.sample_rate)
                pieces.append(chunk({"content": [part]}, "video"))
            if out.actions is not None:
                pieces.append(chunk(action_fields(out.actions, out.action_domain, out.action_fps), "action"))
        if pieces and first:
            state.metrics.ttft.labels("/v1/chat/completions").observe(time.monotonic() - start)
            first = False
        for p in pieces:
            yield p
    state.record(result)
    extra = {"stage_metrics": {str(k): v for k, v in result.metrics.items()}} if body.return_stage_metrics else {}
    yield chunk({}, None, _finish_reason(result.finish_reason), **extra)
    if body.stream_options is not None and body.stream_options.include_usage:
        yield sse(
            {
                "id": f"chatcmpl-{rid}",
                "object": "chat.completion.chunk",
                "created": created,
                "model": state.model_name,
                "choices": [],
                "usage": _usage(result),
            }
        )
    yield SSE_DONE
