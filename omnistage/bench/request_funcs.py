"""One async request function per task; each times one request against the server.

Shapes follow the HTTP API (docs/server.md): ``/v1/images/generations``, ``/v1/images/edits``,
``/v1/videos`` (+ ``/sync``), ``/v1/audio/speech`` and ``/v1/chat/completions``
(which can also carry image tasks via ``modalities: ["image"]``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from omnistage.bench.datasets import BenchRequest
from omnistage.bench.http_utils import (
    audio_seconds,
    data_url,
    decode_data_url,
    error_text,
    iter_sse_json,
)
from omnistage.bench.metrics import RequestResult, parse_stage_metrics
from omnistage.bench.text_stream import TextStreamTracker

DEFAULT_ENDPOINTS = {
    "t2i": "/v1/images/generations",
    "i2i": "/v1/images/edits",
    "t2v": "/v1/videos/sync",
    "i2v": "/v1/videos/sync",
    "tts": "/v1/audio/speech",
    "chat": "/v1/chat/completions",
    "omni": "/v1/chat/completions",
    "asr": "/v1/audio/transcriptions",
}


@dataclass
class ClientSpec:
    """How to talk to the server under test (fixed for a whole run)."""

    base_url: str
    task: str
    endpoint: str | None = None
    model: str | None = None
    return_stage_metrics: bool = False
    stream: bool = False  # tts: stream PCM chunks (time to first packet)
    audio_format: str = "wav"
    pcm_sample_rate: int = 24000  # for raw pcm responses without a sample-rate header
    fps: int | None = None
    strength: float | None = None
    temperature: float | None = 0.0  # chat: greedy, so both servers produce the same tokens
    ignore_eos: bool = True  # chat: fixed output length for a fair comparison
    poll_interval_s: float = 0.2

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + (self.endpoint or DEFAULT_ENDPOINTS[self.task])


@dataclass
class Outcome:
    result: RequestResult
    outputs: list[tuple[str, bytes]] = field(default_factory=list)  # (file extension, bytes)


class RequestFailed(Exception):
    pass


async def send_request(client: httpx.AsyncClient, spec: ClientSpec, req: BenchRequest) -> Outcome:
    """Send one request; failures become ``success=False`` results, never exceptions."""
    fn = _pick(spec)
    result = RequestResult(request_id=req.request_id, slo_s=req.slo_s)
    outcome = Outcome(result)
    start = time.perf_counter()
    try:
        await fn(client, spec, req, outcome, start)
        result.success = True
    except (
        RequestFailed,
        httpx.HTTPError,
        httpx.StreamError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        IndexError,
    ) as e:  # a malformed reply fails this request, not the run
        result.error = str(e) if isinstance(e, RequestFailed) else f"{type(e).__name__}: {e}"
        outcome.outputs.clear()
    result.latency = time.perf_counter() - start
    return outcome


def _pick(spec: ClientSpec) -> Callable[..., Awaitable[None]]:
    endpoint = spec.endpoint or DEFAULT_ENDPOINTS[spec.task]
    if spec.task in ("chat", "omni"):
        return _chat
    if spec.task in ("t2i", "i2i"):
        return _image_via_chat if "chat/completions" in endpoint else _image
    if spec.task in ("t2v", "i2v"):
        return _video_sync if endpoint.rstrip("/").endswith("/sync") else _video_job
    if spec.task == "tts":
        return _speech
    if spec.task == "asr":
        return _transcription
    raise ValueError(f"unknown task {spec.task!r}")


def _gen_fields(spec: ClientSpec, req: BenchRequest) -> dict[str, Any]:
    """Generation fields shared by image / video requests (omitted when unset)."""
    fields: dict[str, Any] = {"prompt": req.prompt}
    if spec.model:
        fields["model"] = spec.model
    if req.width and req.height:
        fields["size"] = f"{req.width}x{req.height}"
    for key in ("num_inference_steps", "guidance_scale", "seed", "negative_prompt", "num_frames"):
        value = getattr(req, key)
        if value is not None:
            fields[key] = value
    if spec.fps is not None and spec.task in ("t2v", "i2v"):
        fields["fps"] = spec.fps
    if spec.strength is not None and spec.task in ("i2i", "i2v"):
        fields["strength"] = spec.strength
    if spec.return_stage_metrics:
        fields["return_stage_metrics"] = True
    fields.update(req.extra)
    return fields


def _check(resp: httpx.Response, body: bytes) -> None:
    if resp.status_code != 200:
        raise RequestFailed(error_text(resp.status_code, body))


def _take_metrics(result: RequestResult, body: dict[str, Any]) -> None:
    durations, peak = parse_stage_metrics(body)
    result.stage_durations.update(durations)
    if peak is not None:
        result.peak_memory_mb = peak


async def _image(client, spec, req, outcome, start) -> None:
    fields = _gen_fields(spec, req)
    fields.setdefault("n", 1)
    fields.setdefault("response_format", "b64_json")
    if spec.task == "i2i":
        if req.image is None:
            raise RequestFailed("i2i request without an input image")
        form = {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}
        resp = await client.post(spec.url, data=form, files={"image": ("input.png", req.image, "image/png")})
    else:
        resp = await client.post(spec.url, json=fields)
    body = await resp.aread()
    _check(resp, body)
    data = json.loads(body)
    images = [decode_data_url(item["b64_json"]) for item in data.get("data", [])]
    if not images:
        raise RequestFailed("response has no images")
    outcome.outputs.extend(("png", b) for b in images)
    outcome.result.num_outputs = len(images)
    _take_metrics(outcome.result, data)


async def _image_via_chat(client, spec, req, outcome, start) -> None:
    fields = _gen_fields(spec, req)
    content: list[dict[str, Any]] = [{"type": "text", "text": fields.pop("prompt")}]
    if spec.task == "i2i":
        content.append({"type": "image_url", "image_url": {"url": data_url(req.image or b"")}})
    if "size" in fields:  # chat carries width/height as generation fields
        w, h = fields.pop("size").split("x")
        fields.update(width=int(w), height=int(h))
    body_json = {"messages": [{"role": "user", "content": content}], "modalities": ["image"], **fields}
    resp = await client.post(spec.url, json=body_json)
    body = await resp.aread()
    _check(resp, body)
    data = json.loads(body)
    images = []
    for choice in data.get("choices", []):
        items = (choice.get("message") or {}).get("content")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and item.get("type") == "image_url":
                images.append(decode_data_url(item["image_url"]["url"]))
    if not images:
        raise RequestFailed("chat response has no images")
    outcome.outputs.extend(("png", b) for b in images)
    outcome.result.num_outputs = len(images)
    _take_metrics(outcome.result, data)


def _video_request(spec: ClientSpec, req: BenchRequest) -> dict[str, Any]:
    fields = _gen_fields(spec, req)
    if spec.task == "i2v":
        if req.image is None:
            raise RequestFailed("i2v request without an input image")
        form = {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}
        return {"data": form, "files": {"input_reference": ("input.png", req.image, "image/png")}}
    return {"json": fields}


async def _video_sync(client, spec, req, outcome, start) -> None:
    resp = await client.post(spec.url, **_video_request(spec, req))
    body = await resp.aread()
    _check(resp, body)
    if not body:
        raise RequestFailed("empty video response")
    outcome.outputs.append(("mp4", body))
    outcome.result.num_outputs = 1


async def _video_job(client, spec, req, outcome, start) -> None:
    resp = await client.post(spec.url, **_video_request(spec, req))
    body = await resp.aread()
    _check(resp, body)
    job = json.loads(body)
    job_url = f"{spec.url.rstrip('/')}/{job['id']}"
    while job.get("status") not in ("completed", "failed"):
        await asyncio.sleep(spec.poll_interval_s)
        resp = await client.get(job_url)
        body = await resp.aread()
        _check(resp, body)
        job = json.loads(body)
    if job["status"] == "failed":
        raise RequestFailed(f"video job failed: {job.get('error')}")
    resp = await client.get(job_url + "/content")
    body = await resp.aread()
    _check(resp, body)
    outcome.outputs.append(("mp4", body))
    outcome.result.num_outputs = 1
    _take_metrics(outcome.result, job)


async def _speech(client, spec, req, outcome, start) -> None:
    fmt = "pcm" if spec.stream else spec.audio_format
    body_json: dict[str, Any] = {"input": req.prompt, "response_format": fmt, "stream": spec.stream}
    if spec.model:
        body_json["model"] = spec.model
    if req.voice:
        body_json["voice"] = req.voice
    body_json.update(req.extra)
    chunks: list[bytes] = []
    async with client.stream("POST", spec.url, json=body_json) as resp:
        if resp.status_code != 200:
            _check(resp, await resp.aread())
        async for chunk in resp.aiter_bytes():
            if chunk and outcome.result.audio_ttfp is None:
                outcome.result.audio_ttfp = time.perf_counter() - start
            chunks.append(chunk)
        sample_rate = int(resp.headers.get("x-sample-rate", spec.pcm_sample_rate))
    audio = b"".join(chunks)
    if not audio:
        raise RequestFailed("empty audio response")
    if fmt == "pcm":  # 16-bit mono PCM
        outcome.result.audio_duration = len(audio) / 2 / sample_rate
        outcome.outputs.append(("pcm", audio))
    else:
        outcome.result.audio_duration = audio_seconds(audio)
        outcome.outputs.append((fmt, audio))
    outcome.result.num_outputs = 1


async def _transcription(client, spec, req, outcome, start) -> None:
    """One clip as the official client sends it (multipart); ``audio_duration`` is the clip's length, so
    ``audio_rtf`` is the recogniser's real-time factor (latency / seconds heard)."""
    if req.audio is None:
        raise RequestFailed("asr: the request has no audio clip")
    form: dict[str, Any] = {"response_format": "json"}
    if spec.model:
        form["model"] = spec.model
    if spec.temperature is not None:
        form["temperature"] = str(spec.temperature)
    form.update({k: str(v) for k, v in req.extra.items()})
    resp = await client.post(spec.url, data=form, files={"file": ("clip.wav", req.audio, "audio/wav")})
    _check(resp, resp.content)
    outcome.result.audio_duration = audio_seconds(req.audio)
    outcome.outputs.append(("txt", resp.json()["text"].encode()))
    outcome.result.num_outputs = 1


async def _chat(client, spec, req, outcome, start) -> None:
    content: Any = req.prompt
    if req.image is not None or req.audio is not None:  # media chat: the picture / the clip first, then the question
        content = []
        if req.image is not None:
            content.append({"type": "image_url", "image_url": {"url": data_url(req.image)}})
        if req.audio is not None:
            content.append(
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(req.audio).decode(), "format": "wav"}}
            )
        content.append({"type": "text", "text": req.prompt})
    body_json: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        # Cumulative usage on every chunk: the token count per chunk comes from the server.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if spec.model:
        body_json["model"] = spec.model
    if spec.task == "omni":  # text and streamed speech from one request (Qwen3-Omni)
        body_json["modalities"] = ["text", "audio"]
    if req.max_tokens is not None:
        body_json["max_tokens"] = req.max_tokens
    if spec.temperature is not None:
        body_json["temperature"] = spec.temperature
    if spec.ignore_eos:
        body_json["ignore_eos"] = True
    if req.seed is not None:
        body_json["seed"] = req.seed
    if spec.return_stage_metrics:
        body_json["return_stage_metrics"] = True
    body_json.update(req.extra)
    tracker = TextStreamTracker(start)
    audio: list[bytes] = []
    rate: list[int] = []
    async with client.stream("POST", spec.url, json=body_json) as resp:
        if resp.status_code != 200:
            _check(resp, await resp.aread())
        async for chunk in iter_sse_json(resp):
            now = time.perf_counter()
            if "error" in chunk:
                err = chunk["error"]
                raise RequestFailed(err.get("message", str(err)) if isinstance(err, dict) else str(err))
            tracker.on_chunk(now, chunk)
            _chat_audio(chunk, now - start, outcome.result, audio, rate)
            _take_metrics(outcome.result, chunk)
    stats = tracker.finish()
    r = outcome.result
    r.ttft, r.e2e_text, r.itl, r.tpot, r.output_tokens = (
        stats.ttft,
        stats.e2e_text,
        stats.itl,
        stats.tpot,
        stats.output_tokens,
    )
    if stats.ttft is None and not audio:
        raise RequestFailed("stream carried no output")
    outcome.outputs.append(("txt", stats.text.encode()))
    if audio:
        pcm = b"".join(audio)
        outcome.outputs.append(("pcm", pcm))
        if rate:
            r.audio_duration = len(pcm) / 2 / rate[0]  # PCM16 mono
    r.num_outputs = 1


def _chat_audio(
    chunk: dict[str, Any], elapsed: float, result: RequestResult, audio: list[bytes], rate: list[int]
) -> None:
    """Audio packets of an omni chat stream (base64 PCM16 in ``delta.audio.data``; the sample rate comes once,
    with the first packet, and is appended to ``rate``)."""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        packet = delta.get("audio") if isinstance(delta, dict) else None
        data = packet.get("data") if isinstance(packet, dict) else None
        if isinstance(data, str) and data:
            if result.audio_ttfp is None:
                result.audio_ttfp = elapsed
            audio.append(base64.b64decode(data))
            if not rate and packet.get("sample_rate"):
                rate.append(int(packet["sample_rate"]))
