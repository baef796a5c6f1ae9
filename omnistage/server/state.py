"""Per-app server state: the engine, the options and limits, and the helpers every route uses to run a
request (admission, abort on client disconnect or ``--request-timeout``). The parts live beside it:
``options.py``, ``admission.py``, ``result.py``, ``deadline.py``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Request

from omnistage.config.settings import ServerSettings
from omnistage.engine.request import OmniRequest, normalize_prompt
from omnistage.lora import LoraAdapters
from omnistage.modality import OutputModality
from omnistage.outputs import OmniRequestOutput
from omnistage.params import RequestKnobs
from omnistage.server.admission import Admission, Slot
from omnistage.server.deadline import Deadline, wait_disconnect
from omnistage.server.drain import Drain
from omnistage.server.errors import APIError, from_engine_error
from omnistage.server.jobstore import job_store
from omnistage.server.metrics import ServerMetrics
from omnistage.server.options import ServeOptions
from omnistage.server.realtime.duplex import DuplexCollector
from omnistage.server.realtime.duplex_admission import DuplexAdmission
from omnistage.server.realtime.sessions import RealtimeSessions
from omnistage.server.result import Result
from omnistage.server.storage import MediaStore

logger = logging.getLogger("omnistage.server")


class ServerState:
    def __init__(self, engine: Any, settings: ServerSettings, options: ServeOptions):
        self.engine = engine
        self.settings = settings
        self.options = options
        self.metrics = ServerMetrics(engine.stage_stats)
        self.admission = Admission(options.max_pending, options.retry_after_s, self.metrics)
        self.drain = Drain(self.admission, engine, options.shutdown_grace_s, options.retry_after_s)
        self.media = options.media_limits()
        self.limits = options.request_limits()
        self.storage = MediaStore(settings.storage, settings.media_store, on_expired=self._files_expired)
        self.jobs = job_store(settings.job_store_url())  # async jobs (videos), shared by a fleet's front-ends
        self.leases: Any = None  # the leases of the jobs this front-end runs (fleet.py), set at start-up
        self.videos: dict[str, Any] = {}  # video job id -> VideoJob, for the jobs this front-end runs
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
        self.duplex: DuplexAdmission | None = None  # full-duplex sessions, admitted by real-time capacity
        if engine.pipeline.info.duplex:  # live sessions, step time, late frames on /metrics
            self.duplex = DuplexAdmission(engine, options.duplex_frame_budget_ms)
            self.metrics.registry.register(DuplexCollector(engine))

    def _files_expired(self, names: list[str]) -> None:
        ids = [name.rsplit(".", 1)[0] for name in names]
        for job_id in ids:
            self.videos.pop(job_id, None)
        task = asyncio.get_running_loop().create_task(self.jobs.delete(*ids))  # their records go too
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # ------------------------------------------------------------------ checks

    def is_base_model(self, model: str | None) -> bool:
        # "default" too: a server serves one model, and clients written for vLLM-Omni send that name
        return model in (*self.model_names, self.engine.model, self.engine.pipeline.name, DEFAULT_MODEL)

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

    def image_mode(self) -> str:
        """How an uploaded image is decoded: ``RGBA`` when a stage the request enters reads alpha (its adapter's
        ``input_image_mode``, as the offline engine converts a given image to it), else the normal form, RGB."""
        sources = [s for s in self.engine.pipeline.stages if not s.inputs]
        return "RGBA" if any(getattr(s.adapter, "input_image_mode", "RGB") == "RGBA" for s in sources) else "RGB"

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
        deadline = Deadline(self.options.request_timeout_s, lambda: self.engine.abort(req.request_id))
        self.drain.running.add(req.request_id)
        try:
            async for out in self.engine.run(req):
                yield out
            deadline.check()  # an aborted request's stream may just end
            self.drain.check(req.request_id)
            finished = True
        except Exception:
            self.metrics.failed.inc()
            deadline.check()  # ...or end in the abort's error: either way the caller hears of the timeout
            self.drain.check(req.request_id)  # (or of the shutdown)
            raise
        finally:
            deadline.cancel()
            self.drain.running.discard(req.request_id)
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
        watcher = asyncio.create_task(wait_disconnect(request))
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


DEFAULT_MODEL = "default"  # the name every server answers to as its (one) base model


def default_model_name(engine: Any) -> str:
    """What a person would type: the pipeline's own name for its built-in model (``omnistage-demo``),
    else the model folder's name (``--served-model-name`` overrides both)."""
    named = engine.pipeline.info.served_model_name
    if named:
        return named
    return Path(engine.model).name if engine.model else engine.pipeline.name
