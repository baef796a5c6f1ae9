"""The diffusion stage engine: owns the denoising loop and batches at step granularity.

Every loop iteration is one step boundary: finished and aborted requests have
left, the admission policy (batching.py) picks the running batch key and
admits waiting requests of that key, and one batched forward advances every
request in the batch by one step of its own timestep table. Newly admitted
requests are prompt-encoded together (and their latents initialised) in the
same worker-thread call; requests finishing together are VAE-decoded
together. The asyncio loop only schedules; all tensor work runs in a worker
thread, so the event loop stays responsive.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from pathlib import Path
from typing import Any, AsyncIterator

import torch
from PIL import Image

from omnistage.params import DiffusionSamplingParams
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageMetrics, StageOutput, StageRequest, StageStats, peak_memory_mb
from omnistage.stages.diffusion.adapter import DiffusionAdapter, DiffusionJob
from omnistage.stages.diffusion.batching import KeyScheduler
from omnistage.stages.diffusion.runner import run_step

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_OUTPUT_TYPES = ("pil", "np", "latent")


def resolve_device(devices: list[str] | None) -> torch.device:
    if devices and torch.cuda.is_available():
        return torch.device(f"cuda:{devices[0]}")
    return torch.device("cpu")


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype: {name!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


class DiffusionStageEngine:
    def __init__(self, ctx: StageContext, adapter: DiffusionAdapter | None = None):
        self.ctx = ctx
        self.stage_id = ctx.spec.stage_id
        engine_args = dict(ctx.deploy.engine_args or {})
        self.max_wait_steps = int(engine_args.pop("max_wait_steps", 8))
        if engine_args:
            raise ValueError(f"stages[{self.stage_id}].engine_args: unknown for a diffusion stage: {', '.join(engine_args)}")
        self.adapter = adapter
        self._sched = KeyScheduler(max_rows=ctx.deploy.max_num_seqs or 8, max_wait_steps=self.max_wait_steps)
        self._jobs: dict[str, tuple[DiffusionJob, asyncio.Queue]] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._healthy = True
        # (batch key, request ids) of the most recent forwards: observable batching for tests and debugging
        self.forward_log: deque[tuple[Any, list[str]]] = deque(maxlen=4096)

    # ------------------------------------------------------------------ protocol

    async def start(self) -> None:
        self._wake = asyncio.Event()
        if self.adapter is None:
            cls = self.ctx.spec.adapter
            if cls is None:
                raise ValueError(f"stage {self.stage_id}: diffusion stage declares no adapter")
            if self.ctx.model is None:
                raise ValueError(f"stage {self.stage_id}: no model folder given")
            folder = Path(self.ctx.model) / (self.ctx.spec.model_subfolder or "")
            device = resolve_device(self.ctx.devices)
            dtype = resolve_dtype(self.ctx.deploy.dtype, device)
            self.adapter = await asyncio.to_thread(cls.load, str(folder), dtype, device)
        self._task = asyncio.create_task(self._loop(), name=f"diffusion-stage-{self.stage_id}")

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        if req.request_id in self._jobs:
            raise ValueError(f"request id {req.request_id!r} is already running on stage {self.stage_id}")
        job = self.make_job(req)  # raises ValueError naming the field, before anything is queued
        out: asyncio.Queue = asyncio.Queue()
        self._jobs[req.request_id] = (job, out)
        self._sched.add(job)
        self._wake.set()
        done = False
        try:
            while True:
                o: StageOutput = await out.get()
                done = o.finished
                yield o
                if done:
                    return
        finally:
            if not done:  # the consumer went away: free the slot at the next step boundary
                job.aborted = True
                self._sched.remove(job)
            self._jobs.pop(req.request_id, None)

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        raise ValueError(f"stage {self.stage_id}: diffusion stages take whole inputs, not streamed chunks")

    async def abort(self, request_id: str) -> None:
        entry = self._jobs.get(request_id)
        if entry is None or entry[0].aborted:
            return
        job, out = entry
        job.aborted = True
        self._sched.remove(job)  # the forward in flight (if any) finishes; its result for this job is dropped
        out.put_nowait(StageOutput(request_id, self.stage_id, {"finish_reason": "abort"}, finished=True,
                                   progress=(job.step, job.total_steps)))

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for job, out in list(self._jobs.values()):
            if not job.aborted:
                job.aborted = True
                out.put_nowait(StageOutput(job.request_id, self.stage_id, {}, True, error="stage shut down"))

    def stats(self) -> StageStats:
        return StageStats(queue_depth=len(self._sched.waiting), running=len(self._sched.running), healthy=self._healthy)

    # ------------------------------------------------------------------ requests

    def make_job(self, req: StageRequest) -> DiffusionJob:
        params = DiffusionSamplingParams.from_any(req.params).filter_extra_args(self.ctx.extra_body_params)
        inputs = req.inputs or {}
        prompt = inputs.get("prompt")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt: expected a string, got {type(prompt).__name__}")
        negative = inputs.get("negative_prompt", params.negative_prompt)
        if negative is not None and not isinstance(negative, str):
            raise ValueError(f"negative_prompt: expected a string, got {type(negative).__name__}")
        if params.output_type not in _OUTPUT_TYPES:
            raise ValueError(f"output_type: {params.output_type!r} is not one of {', '.join(_OUTPUT_TYPES)}")
        images = _input_images(inputs)
        if params.strength is not None and not images:
            raise ValueError("strength: given, but the request has no input image (multi_modal_data.image)")
        if params.generator is not None:
            generator = params.generator
        else:
            seed = params.seed if params.seed is not None else random.randrange(2**63)
            generator = torch.Generator("cpu").manual_seed(seed)
        job = DiffusionJob(req.request_id, prompt, negative, params, images=images or None, inputs=dict(inputs),
                           generator=generator, arrival=req.arrival_time)
        self.adapter.validate(job)
        job.key = self.adapter.batch_key(job)
        return job

    # ------------------------------------------------------------------ loop

    async def _loop(self) -> None:
        while True:
            if not self._sched.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, new = self._sched.next_batch()
            if not batch:
                continue
            now = time.monotonic()
            for j in new:
                j.first_scheduled = now
            self.forward_log.append((batch[0].key, [j.request_id for j in batch]))
            try:
                result = await asyncio.to_thread(run_step, self.adapter, batch, new)
            except Exception as e:  # one failed forward fails its batch, not the engine
                logger.exception("diffusion stage %d: step failed", self.stage_id)
                for j in batch:
                    self._finish(j, error=f"{type(e).__name__}: {e}")
                continue
            for j, err in result.failed:
                self._finish(j, error=err)
            finished = {id(j) for j, _ in result.finished}
            for j in result.advanced:
                if not j.aborted and id(j) not in finished:
                    self._emit(j, StageOutput(j.request_id, self.stage_id, {}, False, progress=(j.step, j.total_steps)))
            for j, data in result.finished:
                self._finish(j, data=data)

    def _emit(self, job: DiffusionJob, out: StageOutput) -> None:
        entry = self._jobs.get(job.request_id)
        if entry is not None and entry[0] is job and not job.aborted:
            entry[1].put_nowait(out)

    def _finish(self, job: DiffusionJob, data: dict | None = None, error: str | None = None) -> None:
        self._sched.remove(job)
        now = time.monotonic()
        started = job.first_scheduled or now
        metrics = StageMetrics(queue_time_s=started - job.arrival, run_time_s=now - started, num_steps=job.step,
                               peak_memory_mb=peak_memory_mb())
        self._emit(job, StageOutput(job.request_id, self.stage_id, data or {}, True, metrics=metrics, error=error,
                                    progress=(job.step, job.total_steps)))
        job.aborted = True  # closed: nothing more is emitted for it


def _input_images(inputs: dict[str, Any]) -> list[Image.Image]:
    mm = inputs.get("multi_modal_data") or {}
    if not isinstance(mm, dict):
        raise ValueError(f"multi_modal_data: expected a dict, got {type(mm).__name__}")
    image = mm.get("image")
    if image is None:
        return []
    images = list(image) if isinstance(image, (list, tuple)) else [image]
    if not images:
        raise ValueError("multi_modal_data.image: empty list")
    for i, im in enumerate(images):
        if not isinstance(im, Image.Image):
            raise ValueError(f"multi_modal_data.image[{i}]: expected a PIL image, got {type(im).__name__}")
    return [im.convert("RGB") if im.mode != "RGB" else im for im in images]
