"""POST /v1/chat/completions: OpenAI chat with multimodal content parts in and
text / image / audio / video out, optionally streamed (SSE)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from pydantic import ValidationError

from omnistage.engine.request import OmniRequest
from omnistage.media_intake import model_audio_rate
from omnistage.modality import OutputModality
from omnistage.outputs import OmniRequestOutput
from omnistage.params import validation_error
from omnistage.server.deps import get_state
from omnistage.server.errors import bad_request, error_responses, from_engine_error
from omnistage.server.media import (
    audio_from_bytes,
    b64,
    data_url,
    decode_base64,
    encode_audio,
    encode_image,
    encode_mp4,
    fetch_media,
    load_audio,
    load_image,
    load_video,
    model_form_part,
    pcm16,
)
from omnistage.server.middleware import request_id
from omnistage.server.openapi import SSE, success
from omnistage.server.prompt_warnings import prompt_warnings, warning_headers
from omnistage.server.protocol import ChatCompletionRequest, SpeechRequest
from omnistage.server.routes.audio import speech_information
from omnistage.server.state import Result, ServerState
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
    req = await build_request(state, body, request_id(request.scope), transcript=True)
    # what the request asked that is ignored (a stage's unused sampling params), and words a closed-vocabulary
    # model (the demo) cannot draw: a header on either answer, a field on the JSON one
    warnings = [*req.warnings, *prompt_warnings(state.engine.pipeline.info, state.model_name, req.prompt.get("prompt"))]
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


async def build_request(
    state: ServerState, body: ChatCompletionRequest, rid: str, transcript: bool = False
) -> OmniRequest:
    """A chat body as the engine's request, every check before model work (also /v1/realtime's path).
    ``transcript``: speech asked without text still runs for the text too (the answer's ``audio.transcript``)."""
    lora = state.check_model(body.model)
    if body.logprobs:
        raise bad_request("logprobs: not supported", "logprobs")
    engine = state.engine
    modalities = _modalities(state, body.modalities)
    knobs = body.knobs(body.extra_body)
    state.check_n(knobs.n)
    wants = OutputModality(0)
    for m in modalities or engine.output_modalities.names():
        wants |= OutputModality.parse(m)
    if (knobs.n or 1) > 1 and OutputModality.TEXT in wants and state.text_stages():
        raise bad_request("n: only n=1 is supported for text output", "n")
    prompt = await build_prompt(state, body)
    if OutputModality.TEXT in engine.output_modalities:
        _choose_voice(state, body, knobs, prompt)
    else:  # a speech family (Qwen3-TTS, VibeVoice, ...): the speech route's voice / clone / language fields
        await _speech_fields(state, body, knobs, prompt)
    if transcript and _text_hidden(state, body):
        modalities = [*(modalities or []), "text"]
    return state.make_request(prompt, rid, body.sampling_params_list, modalities, knobs, lora)


def _text_hidden(state: ServerState, body: ChatCompletionRequest) -> bool:
    """Speech asked without text of a model that speaks its text reply: the text is the speech's transcript
    (OpenAI's ``audio.transcript``), not the message content."""
    if not body.modalities or OutputModality.TEXT not in state.engine.output_modalities:
        return False
    asked = OutputModality(0)
    for m in body.modalities:
        asked |= OutputModality.parse(m)
    return OutputModality.AUDIO in asked and OutputModality.TEXT not in asked


def audio_delta(out: OmniRequestOutput) -> np.ndarray | None:
    """The output's new audio as float32 mono, or None when it brought none."""
    audio = out.delta.get("audio")
    if audio is None:
        return None
    arr = np.asarray(audio.detach().cpu() if hasattr(audio, "detach") else audio, dtype=np.float32).reshape(-1)
    return arr if arr.size else None


def _choose_voice(state: ServerState, body: ChatCompletionRequest, knobs: Any, prompt: dict[str, Any]) -> None:
    """OpenAI's ``audio.voice`` (or ``speaker`` in extra_body) picks one of the model's voices."""
    chosen = body.audio is not None and body.audio.voice is not None
    voice = body.audio.voice if chosen else knobs.extras().get("speaker")
    if voice is None:
        return
    field = "audio.voice" if chosen else "speaker"
    names = list(state.engine.pipeline.info.speaks.voices)
    if not isinstance(voice, str) or voice.lower() not in {n.lower() for n in names}:
        raise bad_request(f"{field}: {voice!r} is not one of this model's voices ({', '.join(names) or 'none'})", field)
    prompt.setdefault("additional_information", {})["voice"] = voice


# the speech route's fields a chat turn to a speech family may carry in extra_body
SPEECH_CHAT_FIELDS = (
    "instructions",
    "language",
    "ref_audio",
    "ref_text",
    "x_vector_only_mode",
    "initial_codec_chunk_frames",
)


async def _speech_fields(state: ServerState, body: ChatCompletionRequest, knobs: Any, prompt: dict[str, Any]) -> None:
    """``audio.voice`` plus the speech route's own fields given in ``extra_body`` (``language``,
    ``instructions``, ``ref_audio`` + ``ref_text``, ...), checked and resolved as ``/v1/audio/speech`` does
    them: a preset or registered voice, a clone's clip fetched and decoded through the decode limits."""
    extras = knobs.extras()
    fields = {k: extras[k] for k in SPEECH_CHAT_FIELDS if k in extras}
    voice = body.audio.voice if body.audio is not None and body.audio.voice is not None else extras.get("speaker")
    try:
        speech = SpeechRequest.model_validate({"input": ".", "voice": voice, **fields})
    except ValidationError as e:
        raise validation_error(e, "extra_body.") from None
    info = await speech_information(state, speech)
    if info:
        prompt["additional_information"] = {**(prompt.get("additional_information") or {}), **info}


def _modalities(state: ServerState, asked: list[str] | None) -> list[str] | None:
    if asked is None:
        return None
    produced = state.engine.output_modalities
    for i, name in enumerate(asked):
        try:
            m = OutputModality.parse(name)
        except ValueError as e:
            raise bad_request(f"modalities[{i}]: {e}", "modalities") from None
        if m & ~produced:
            raise bad_request(
                f"modalities: model {state.model_name!r} does not produce {name} (it produces {produced})", "modalities"
            )
    if not asked:
        raise bad_request("modalities: empty list", "modalities")
    return asked


# --------------------------------------------------------------------------- prompt


async def build_prompt(state: ServerState, body: ChatCompletionRequest) -> dict[str, Any]:
    """Messages for autoregressive source stages (vLLM's renderer templates them and loads their media);
    the last user text and decoded media otherwise."""
    sources = [s for s in state.engine.pipeline.stages if not s.inputs]
    if any(s.kind in ("llm", "ar") for s in sources):  # an AR speech family's hook reads the messages
        return await _chat_prompt(state, body)
    return await _decoded_prompt(state, body)


async def _chat_prompt(state: ServerState, body: ChatCompletionRequest) -> dict[str, Any]:
    """OpenAI messages as vLLM's chat renderer takes them. Media parts are fetched here (the
    server's limits and allowlist), checked to decode, and passed on as base64 ``data:`` URLs."""
    messages: list[dict[str, Any]] = []
    pending: list[Any] = []  # media fetches, run together
    for i, msg in enumerate(body.messages):
        entry = msg.model_dump(exclude_none=True)
        if isinstance(msg.content, list):
            parts: list[dict[str, Any]] = []
            for j, part in enumerate(msg.content):
                where = f"messages[{i}].content[{j}]"
                if part.type in ("text", "input_text"):
                    parts.append({"type": "text", "text": part.text})
                    continue
                out: dict[str, Any] = {"type": part.type}
                parts.append(out)
                pending.append(_media_part(state, part, where, out))
            entry["content"] = parts
        messages.append(entry)
    results = await asyncio.gather(*pending, return_exceptions=True)
    for r in results:  # the first bad part in message order names the error
        if isinstance(r, BaseException):
            raise r
    template = {
        **(body.chat_template_kwargs or {}),
        "add_generation_prompt": body.add_generation_prompt,
        "continue_final_message": body.continue_final_message,
    }  # the top-level flags win, as in vLLM
    prompt: dict[str, Any] = {"messages": messages, "additional_information": {"chat_template_kwargs": template}}
    if body.mm_processor_kwargs:
        prompt["mm_processor_kwargs"] = body.mm_processor_kwargs
    return prompt


async def _media_part(state: ServerState, part: Any, where: str, out: dict[str, Any]) -> None:
    """Fills ``out`` with the part's media, decoded within the limits, as vLLM's part of the same type in the
    model's form (audio at the model's rate, RGB images: media.model_form_part)."""
    limits = state.media
    rate = model_audio_rate(state.engine.model)
    if part.type == "input_audio":
        field = f"{where}.input_audio"
        data = decode_base64(part.input_audio.data, f"{field}.data", limits)
        out.update(await asyncio.to_thread(model_form_part, "input_audio", data, field, limits, rate))
        return
    field = f"{where}.{part.payload}"  # as the caller named it (``image`` in the short form)
    url = part.url()
    got = await fetch_media(url, field, limits)
    # the declared type too: a 415 if not its kind
    out.update(await asyncio.to_thread(model_form_part, part.type, got.data, field, limits, rate, got.mime, url))


async def _decoded_prompt(state: ServerState, body: ChatCompletionRequest) -> dict[str, Any]:
    """For pipelines that start with a non-llm stage: the last user text and the decoded media."""
    limits = state.media
    mm: dict[str, list[Any]] = {"image": [], "audio": [], "video": []}
    user_text = None
    for i, msg in enumerate(body.messages):
        content: Any = msg.content
        texts: list[str] = []
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                if part.type in ("text", "input_text"):
                    texts.append(part.text)
                elif part.type == "image_url":
                    mm["image"].append(await load_image(part.url(), f"{where}.{part.payload}", limits))
                elif part.type == "audio_url":
                    mm["audio"].append(await load_audio(part.url(), f"{where}.{part.payload}", limits))
                elif part.type == "input_audio":
                    data = decode_base64(part.input_audio.data, f"{where}.input_audio.data", limits)
                    mm["audio"].append(await asyncio.to_thread(audio_from_bytes, data, f"{where}.input_audio", limits))
                elif part.type == "video_url":
                    mm["video"].append(await load_video(part.url(), f"{where}.{part.payload}", limits))
        if msg.role == "user" and texts:
            user_text = "\n".join(texts)
    if user_text is None:
        raise bad_request("messages: no user message with text content", "messages")
    prompt: dict[str, Any] = {"prompt": user_text}
    multi_modal = {k: (v[0] if len(v) == 1 else v) for k, v in mm.items() if v}
    if multi_modal:
        prompt["multi_modal_data"] = multi_modal
    if body.negative_prompt:
        prompt["negative_prompt"] = body.negative_prompt
    return prompt


# --------------------------------------------------------------------------- responses


def _image_part(image: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(encode_image(image, "png"), "image/png")}}


def _video_part(
    video: np.ndarray, fps: float | None, audio: np.ndarray | None = None, sample_rate: int | None = None
) -> dict[str, Any]:
    """The video as an MP4 ``video_url`` part; with the request's audio (a video+audio stage) as its soundtrack."""
    mp4 = encode_mp4(video, fps or 8, audio, sample_rate)
    return {"type": "video_url", "video_url": {"url": data_url(mp4, "video/mp4")}}


def _usage(result: Result) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


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
    if _text_hidden(state, body):  # the text is the speech's transcript only
        message["content"] = None
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
    hidden = _text_hidden(state, body)
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
