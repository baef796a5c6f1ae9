"""Per-app server state: the engine, options, admission control and the
helpers every route uses to run a request (with abort on client disconnect)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import Request

from omnistage.config.settings import ServerSettings
from omnistage.engine.request import OmniRequest, normalize_prompt
from omnistage.limits import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_INFERENCE_STEPS,
    DEFAULT_MAX_NUM_FRAMES,
    RequestLimits,
)
from omnistage.lora import LoraAdapters
from omnistage.modality import OutputModality
from omnistage.outputs import OmniRequestOutput
from omnistage.params import RequestKnobs
from omnistage.server.errors import APIError, from_engine_error
from omnistage.server.jobs import JobStore
from omnistage.server.media import MediaLimits
from omnistage.server.media_fetch import DEFAULT_MAX_AUDIO_S
from omnistage.server.metrics import ServerMetrics
from omnistage.server.realtime.sessions import RealtimeSessions
from omnistage.server.storage import FileStorage

logger = logging.getLogger("omnistage.server")


@dataclass
class ServeOptions:
    """What the ``serve`` command line controls (environment settings live in ServerSettings)."""

    served_model_name: str | list[str] | None = None  # several: every one is answered to, the first reported
    api_key: str | None = None
    max_pending: int | None = None  # admitted generation requests at once; more get 503
    retry_after_s: int = 2
    max_n: int = 10  # outputs per request
    max_body_bytes: int = 64 << 20
    allowed_local_media_path: str | Path | None = None
    max_media_bytes: int = 20 << 20  # one uploaded / inline media input
    max_download_bytes: int = 20 << 20  # one media input fetched from an http(s) URL
    media_fetch_timeout_s: float = 10.0  # one http(s) media download, start to end
    max_audio_s: float = DEFAULT_MAX_AUDIO_S  # one audio input, declared or decoded (decode_limits.py)
    allowed_media_domains: list[str] | None = None  # hosts http(s) media may come from (None: any)
    shutdown_grace_s: float = 30.0  # in-flight requests get this long to finish on shutdown
    request_timeout_s: float | None = None  # a request (or video job) still running after this is aborted
    # per-request caps (limits.py; None: no cap)
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    max_num_frames: int | None = DEFAULT_MAX_NUM_FRAMES
    max_inference_steps: int | None = DEFAULT_MAX_INFERENCE_STEPS
    max_tokens: int | None = None
    allow_runtime_lora_updating: bool = False  # POST /v1/load_lora_adapter and /v1/unload_lora_adapter
    # /v1/realtime
    max_realtime_sessions: int | None = None  # open WebSocket sessions at once; more are refused (None: no cap)
    realtime_max_event_bytes: int = 8 << 20  # one client event (a larger frame gets an error event)
    realtime_max_buffer_s: float = 120.0  # seconds of uncommitted input audio one session may hold
    realtime_idle_timeout_s: float | None = None  # a session with no client event for this long is closed
    realtime_max_session_s: float | None = None  # a session open this long is closed

    def media_limits(self) -> MediaLimits:
        root = Path(self.allowed_local_media_path).resolve() if self.allowed_local_media_path else None
        domains = (
            None
            if self.allowed_media_domains is None
            else frozenset(d.strip().lower() for d in self.allowed_media_domains if d.strip())
        )
        limits = MediaLimits(
            max_bytes=self.max_media_bytes,
            max_download_bytes=self.max_download_bytes,
            fetch_timeout_s=self.media_fetch_timeout_s,
            allowed_media_domains=domains,
            max_audio_s=self.max_audio_s,
            allowed_local_media_path=root,
        )
        if self.max_image_pixels is not None:  # an input image may be as large as an output one, no larger
            limits.max_image_pixels = self.max_image_pixels
        if self.max_num_frames is not None:
            limits.max_video_frames = self.max_num_frames
        return limits

    def request_limits(self) -> RequestLimits:
        return RequestLimits(
            max_image_pixels=self.max_image_pixels,
            max_num_frames=self.max_num_frames,
            max_inference_steps=self.max_inference_steps,
            max_tokens=self.max_tokens,
        )


class Admission:
    """Bounded admission: at most ``limit`` generation requests in flight."""

    def __init__(self, limit: int | None, retry_after_s: int, metrics: ServerMetrics):
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.metrics = metrics
        self.pending = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.closing = False

    def acquire(self) -> Slot:
        if self.closing:
            raise APIError(
                503, "server is shutting down", code="shutting_down", headers={"Retry-After": str(self.retry_after_s)}
            )
        if self.limit is not None and self.pending >= self.limit:
            self.metrics.rejected.inc()
            raise APIError(
                503,
                f"server is saturated ({self.pending} requests in flight, --max-pending {self.limit}); retry later",
                code="server_saturated",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.pending += 1
        self._idle.clear()
        self.metrics.in_flight.set(self.pending)
        return Slot(self)

    def _release(self) -> None:
        self.pending -= 1
        self.metrics.in_flight.set(self.pending)
        if self.pending == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False


class Slot:
    """One admitted request; releasing twice is harmless (a stream and its response both release)."""

    def __init__(self, admission: Admission):
        self._admission: Admission | None = admission

    def release(self) -> None:
        admission, self._admission = self._admission, None
        if admission is not None:
            admission._release()


@dataclass
class Result:
    """Everything a finished request produced, merged over its final stages."""

    text: str | None = None
    images: list[Any] = field(default_factory=list)
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    video: np.ndarray | None = None
    fps: float | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)

    def add(self, out: OmniRequestOutput, text_stages: set[int]) -> None:
        self.text = out.text if out.text is not None else self.text
        self.images = list(out.images) if out.images else self.images
        if out.audio is not None:
            self.audio, self.sample_rate = out.audio, out.sample_rate
        if out.video is not None:
            self.video, self.fps = out.video, out.fps
        self.finish_reason = out.finish_reason or self.finish_reason
        self.metrics.update(out.metrics or {})
        if out.num_prompt_tokens:
            self.prompt_tokens = max(self.prompt_tokens, out.num_prompt_tokens)
        tokens = sum(int(m.get("num_tokens", 0)) for sid, m in (out.metrics or {}).items() if sid in text_stages)
        self.completion_tokens = max(self.completion_tokens, tokens)


class ServerState:
    def __init__(self, engine: Any, settings: ServerSettings, options: ServeOptions):
        self.engine = engine
        self.settings = settings
        self.options = options
        self.metrics = ServerMetrics(engine.stage_stats)
        self.admission = Admission(options.max_pending, options.retry_after_s, self.metrics)
        self.media = options.media_limits()
        self.limits = options.request_limits()
        self.storage = FileStorage(settings.storage, on_expired=self._files_expired)
        self.jobs = JobStore(settings.storage.path)  # async jobs (videos) recorded across restarts
        self.videos: dict[str, Any] = {}  # video job id -> VideoJob
        self.video_tasks: dict[str, asyncio.Task] = {}
        named = options.served_model_name
        self.model_names = ([named] if isinstance(named, str) else list(named or [])) or [default_model_name(engine)]
        self.model_name = self.model_names[0]  # responses name the first, as vLLM's do
        self.loras = LoraAdapters(engine)  # the adapters `model` may name besides the base model
        if options.allow_runtime_lora_updating:
            why = self.loras.runtime_updates_possible()
            if why is not None:
                raise ValueError(f"--allow-runtime-lora-updating: {why}")
        self.started_at = int(time.time())
        self.background: set[asyncio.Task] = set()  # async jobs (videos) to finish on shutdown
        self.realtime = RealtimeSessions(options.max_realtime_sessions, self.metrics.registry)

    def _files_expired(self, names: list[str]) -> None:
        ids = [name.rsplit(".", 1)[0] for name in names]
        for job_id in ids:
            self.videos.pop(job_id, None)
        task = asyncio.get_running_loop().create_task(self.jobs.delete(*ids))  # their records go too
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # ------------------------------------------------------------------ checks

    def is_base_model(self, model: str | None) -> bool:
        return model in (*self.model_names, self.engine.model, self.engine.pipeline.name)

    def check_model(self, model: str | None) -> str | None:
        """404 unless ``model`` is the base model or a loaded LoRA adapter; returns the adapter's name (None
        for the base model)."""
        if model is None or self.is_base_model(model):
            return None
        if self.loras.get(model) is not None:
            return model
        adapters = [m.name for m in self.loras.modules()]
        served = ", ".join(map(repr, self.model_names)) + (
            f" and the LoRA adapters {', '.join(map(repr, adapters))}" if adapters else ""
        )
        raise APIError(
            404, f"model {model!r} does not exist; this server serves {served}", param="model", code="model_not_found"
        )

    def require(self, modality: OutputModality, what: str) -> None:
        """Generic routes work with any pipeline that produces ``modality``."""
        if modality not in self.engine.output_modalities:
            raise APIError(
                400,
                f"model {self.model_name!r} does not produce {what} "
                f"(pipeline {self.engine.pipeline.name!r} outputs {self.engine.output_modalities})",
                param="model",
                code="unsupported_modality",
            )

    def check_n(self, n: int | None) -> None:
        if n is not None and n > self.options.max_n:
            raise APIError(400, f"n: {n} exceeds the maximum of {self.options.max_n} outputs per request", param="n")

    def text_stages(self) -> set[int]:
        return {s.stage_id for s in self.engine.pipeline.stages if s.knobs == "llm"}

    # ------------------------------------------------------------------ running

    def make_request(
        self,
        prompt: Any,
        request_id: str,
        sampling_params_list: Any = None,
        output_modalities: Any = None,
        knobs: RequestKnobs | None = None,
        lora: str | None = None,
    ) -> OmniRequest:
        """Parse a request (``AsyncOmni.make_request``) and hold it to this server's caps, before any
        model work: a 400 naming the field for a request above them. ``lora``: the adapter ``model`` named
        (``check_model``)."""
        if lora is not None:
            prompt = {**normalize_prompt(prompt), "lora": lora}
        req = self.engine.make_request(prompt, request_id, sampling_params_list, output_modalities, knobs, warnings=[])
        self.limits.check(req, knobs, self.engine.default_sampling_params_list)
        return req

    async def stream(self, req: OmniRequest, *, slot: Slot | None = None) -> AsyncIterator[OmniRequestOutput]:
        """Stream one request's outputs; leaving early (error, disconnect) aborts it in every stage.
        With ``--request-timeout`` a request still running after it is aborted and ends in a 504."""
        slot = slot or self.admission.acquire()
        finished = False
        deadline = _Deadline(self.options.request_timeout_s, lambda: self.engine.abort(req.request_id))
        try:
            async for out in self.engine.run(req):
                yield out
            deadline.check()  # an aborted request's stream may just end
            finished = True
        except Exception:
            self.metrics.failed.inc()
            deadline.check()  # ...or end in the abort's error: either way the caller hears of the timeout
            raise
        finally:
            deadline.cancel()
            if not finished:
                self.metrics.aborted.inc()
                await asyncio.shield(self.engine.abort(req.request_id))
            slot.release()

    async def run(self, request: Request | None, req: OmniRequest, on_output: Any = None) -> Result:
        """Run to completion; a client that disconnects meanwhile aborts the request."""
        req.stream = False  # only the final outputs make the answer (on_output sees the data as one delta)
        slot = self.admission.acquire()
        result = Result()
        text_stages = self.text_stages()
        request_id = req.request_id

        async def collect() -> Result:
            async for out in self.stream(req, slot=slot):
                if on_output is not None:
                    on_output(out)
                if out.finished:
                    result.add(out, text_stages)
            self.record(result)
            return result

        try:
            task = asyncio.create_task(collect(), name=f"request-{request_id}")
        except BaseException:
            slot.release()
            raise
        if request is None:
            return await task
        watcher = asyncio.create_task(_wait_disconnect(request))
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            watcher.cancel()
        if task not in done:
            logger.info("request %s: client disconnected, aborting", request_id)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise APIError(499, "client disconnected", code="client_closed_request")
        try:
            return task.result()
        except APIError:
            raise
        except Exception as e:  # mapped here so the connection survives (no re-raise past the app)
            raise from_engine_error(e) from None

    def record(self, result: Result) -> None:
        m = self.metrics
        m.images.inc(len(result.images))
        if result.audio is not None and result.sample_rate:
            m.audio_seconds.inc(result.audio.shape[-1] / float(result.sample_rate))
        if result.video is not None:
            m.videos.inc()
        m.prompt_tokens.inc(result.prompt_tokens)
        m.generation_tokens.inc(result.completion_tokens)
        for sid, stage in result.metrics.items():
            m.stage_latency.labels(str(sid)).observe(float(stage.get("run_time_s", 0.0)))


def default_model_name(engine: Any) -> str:
    """What a person would type: the pipeline's own name for its built-in model (``omnistage-demo``),
    else the model folder's name (``--served-model-name`` overrides both)."""
    named = engine.pipeline.info.served_model_name
    if named:
        return named
    return Path(engine.model).name if engine.model else engine.pipeline.name


class _Deadline:
    """Calls ``expire`` (an abort) once ``seconds`` have passed, unless cancelled first."""

    def __init__(self, seconds: float | None, expire: Any):
        self.seconds = seconds
        self.expired = False
        self._task: asyncio.Task | None = None
        self._handle = None
        if seconds:
            self._handle = asyncio.get_running_loop().call_later(seconds, self._fire, expire)

    def _fire(self, expire: Any) -> None:
        self.expired = True
        logger.warning("request exceeded --request-timeout %gs; aborting it", self.seconds)
        self._task = asyncio.get_running_loop().create_task(expire())  # referenced until it ran

    def check(self) -> None:
        if self.expired:
            raise APIError(
                504,
                f"the request did not finish within this server's --request-timeout of {self.seconds:g} s",
                code="request_timeout",
            )

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


async def _wait_disconnect(request: Request) -> None:
    """Returns once the client has gone. The route has read the body, so the server's next message is the
    disconnect (waited for as an event, as ``vllm serve`` listens for it: no polling timer per running request)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
