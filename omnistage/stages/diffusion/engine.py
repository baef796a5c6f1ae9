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
from typing import Any

import torch
from PIL import Image

from omnistage.errors import InvalidRequestError, StageUnavailableError
from omnistage.params import DiffusionSamplingParams
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageError, StageOutput, StageRequest, StageStats
from omnistage.stages.diffusion.acceleration import Acceleration, apply_acceleration
from omnistage.stages.diffusion.adapter import DiffusionAdapter, DiffusionJob
from omnistage.stages.diffusion.batching import KeyScheduler
from omnistage.stages.diffusion.cache_rules import steps_reused
from omnistage.stages.diffusion.devices import resolve_device
from omnistage.stages.diffusion.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, LoraSet
from omnistage.stages.diffusion.runner import run_step
from omnistage.stages.inprocess import InProcessEngine

logger = logging.getLogger(__name__)

DEFAULT_ADMIT_WINDOW_STEPS = 2.0
MAX_ADMIT_WINDOW_S = 0.5

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
_OUTPUT_TYPES = ("pil", "np", "latent")


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype: {name!r} is not one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


def load_adapter(ctx: StageContext, device: torch.device) -> DiffusionAdapter:
    """The stage's adapter class loaded from its model folder onto ``device`` (blocking: call it in a thread)."""
    cls = ctx.spec.adapter
    if cls is None:
        raise ValueError(f"stage {ctx.spec.stage_id}: diffusion stage declares no adapter")
    if ctx.model is None:
        raise ValueError(f"stage {ctx.spec.stage_id}: no model folder given")
    folder = Path(ctx.model) / (ctx.spec.model_subfolder or "")
    dtype = resolve_dtype(ctx.deploy.dtype, device)
    if ctx.deploy.quantization is not None:  # checked at start-up (quantization.check_stage)
        return cls.load(str(folder), dtype, device, quantization=ctx.deploy.quantization)
    return cls.load(str(folder), dtype, device)


class DiffusionStageEngine(InProcessEngine[DiffusionJob]):
    def __init__(self, ctx: StageContext, adapter: DiffusionAdapter | None = None):
        super().__init__(ctx.spec.stage_id)
        self.ctx = ctx
        engine_args = dict(ctx.deploy.engine_args or {})
        self.max_wait_steps = int(engine_args.pop("max_wait_steps", 8))
        # When several requests finished together and left nothing running, the next forward waits up to this
        # many step times (at most MAX_ADMIT_WINDOW_S; 0: never) for as many requests to arrive: clients answered
        # together come back together, and admitted one by one the first would run a step ahead of the rest,
        # finish and be replaced first, and the staggering (an extra forward, encode and decode per wave) would
        # repeat every wave. A request that finished alone opens no window (one client in turn waits for
        # nothing). Measured: docs/benchmarks.md, "Admission window".
        self.admit_window_steps = float(engine_args.pop("admit_window_steps", DEFAULT_ADMIT_WINDOW_STEPS))
        self._step_s = 0.0  # a recent forward's duration (moving average)
        # when several requests finishing together left nothing running: (then, requests to expect back by)
        self._burst: tuple[float, int] | None = None
        if engine_args:
            raise ValueError(
                f"stages[{self.stage_id}].engine_args: unknown for a diffusion stage: {', '.join(engine_args)}"
            )
        self.adapter = adapter
        self.accel = Acceleration()  # applied at start (deploy ``acceleration:``)
        self.lora: LoraSet | None = None  # per-request LoRA adapters (deploy ``enable_lora`` / ``lora_modules``)
        # held around every forward and every adapter load/unload: weights never change under a forward
        self._step_lock = asyncio.Lock()
        self._sched = KeyScheduler(max_rows=ctx.deploy.max_num_seqs or 8, max_wait_steps=self.max_wait_steps)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._healthy = True
        self._parallel: Any = None  # with devices_per_replica > 1: this is rank 0 (parallel/leader.py)
        self._broken: str | None = None  # a multi-device step failed: the replica waits to be restarted
        # (batch key, request ids) of the most recent forwards: observable batching for tests and debugging
        self.forward_log: deque[tuple[Any, list[str]]] = deque(maxlen=4096)

    # ------------------------------------------------------------------ protocol

    async def start(self) -> None:
        self._wake = asyncio.Event()
        if self.adapter is None:
            self.adapter = await asyncio.to_thread(load_adapter, self.ctx, resolve_device(self.ctx.devices))
        if self.ctx.deploy.devices_per_replica > 1:  # this process is rank 0 of the replica's process group
            from omnistage.stages.diffusion.parallel.leader import Leader

            self._parallel = await asyncio.to_thread(Leader.start, self.ctx, self.adapter)
        self.accel = await asyncio.to_thread(
            apply_acceleration, self.adapter, self.ctx.deploy.acceleration, f"stages[{self.stage_id}].acceleration"
        )
        if self.ctx.deploy.lora_enabled:
            await self._start_lora()
        self._task = asyncio.create_task(self._loop(), name=f"diffusion-stage-{self.stage_id}")

    def _new_item(self, req: StageRequest) -> DiffusionJob:
        if self._broken:
            raise StageUnavailableError(self._broken)
        return self.make_job(req)  # raises ValueError naming the field, before anything is queued

    def _admitted(self, item: DiffusionJob) -> None:
        # taken (checked and queued; the step count is known once it is prepared): a video job's POST waits
        # for this verdict, so a request the family refuses is its 400, not a job that fails later
        self._emit(item, StageOutput(item.request_id, self.stage_id, {}, False, progress=(0, 0)))
        self._sched.add(item)
        self._wake.set()

    def _on_close(self, item: DiffusionJob) -> None:
        self._sched.remove(item)  # the forward in flight (if any) finishes; its result for this job is dropped

    def _left(self, item: DiffusionJob) -> None:
        if item.lora is not None:
            item.lora.release()

    def _progress(self, item: DiffusionJob) -> tuple[int, int]:
        return (item.step, item.total_steps)

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        raise ValueError(f"stage {self.stage_id}: diffusion stages take whole inputs, not streamed chunks")

    # ------------------------------------------------------------------ LoRA adapters

    async def _start_lora(self) -> None:
        d, where = self.ctx.deploy, f"stages[{self.stage_id}]"
        pipe = getattr(self.adapter, "pipe", None)
        if pipe is None:
            raise ValueError(
                f"{where}.lora_modules: {type(self.adapter).__name__} has no diffusers pipeline to take LoRA adapters"
            )
        if d.acceleration is not None and d.acceleration.compile:
            raise ValueError(
                f"{where}.acceleration.compile: not available with LoRA adapters (the per-row "
                "LoRA layers would be traced into the compiled blocks)"
            )
        max_loras = d.max_loras or max(DEFAULT_MAX_LORAS, len(d.lora_modules))
        if len(d.lora_modules) > max_loras:
            raise ValueError(f"{where}.lora_modules: {len(d.lora_modules)} adapters, above max_loras={max_loras}")
        self.lora = LoraSet(pipe, self.adapter.device, max_loras, d.max_lora_rank or DEFAULT_MAX_LORA_RANK)
        for i, m in enumerate(d.lora_modules):
            try:
                await self.load_lora(m.name, m.path)
            except InvalidRequestError as e:
                raise ValueError(f"{where}.lora_modules[{i}] ({m.name}={m.path}): {e.message}") from None

    def lora_names(self) -> list[str]:
        return self.lora.names if self.lora is not None else []

    async def load_lora(self, name: str, path: str) -> None:
        """Load an adapter into a free slot (``InvalidRequestError`` naming ``lora_path`` / ``lora_name``)."""
        if self.lora is None:
            raise InvalidRequestError("lora_name", f"stage {self.stage_id} takes no LoRA adapters (enable_lora)")
        lora = await asyncio.to_thread(self.lora.read, path)  # parsed beside the running forwards
        async with self._step_lock:
            self.lora.collect()
            self.lora.load(name, lora)

    async def unload_lora(self, name: str) -> None:
        """New requests no longer find the adapter; the running ones finish with it."""
        if self.lora is None:
            raise InvalidRequestError("lora_name", f"stage {self.stage_id} takes no LoRA adapters (enable_lora)")
        async with self._step_lock:
            self.lora.unload(name)

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._fail_all()
        self.accel.close()  # the cache / compile hooks leave the (possibly shared) adapter's blocks
        if self._parallel is not None:
            await asyncio.to_thread(self._parallel.close)
            self._parallel = None
        if self.lora is not None:
            self.lora.close()  # so do the LoRA layers
            self.lora = None

    def stats(self) -> StageStats:
        return StageStats(
            queue_depth=len(self._sched.waiting),
            running=len(self._sched.running),
            healthy=self._healthy and not self._broken,
            detail=self._broken or "",
        )

    # ------------------------------------------------------------------ requests

    def make_job(self, req: StageRequest) -> DiffusionJob:
        params = DiffusionSamplingParams.from_any(req.params)  # parsed at the edge; a dict only from other callers
        inputs = req.inputs or {}
        prompt = inputs.get("prompt")
        if not isinstance(prompt, str):
            raise InvalidRequestError("prompt", f"expected a string, got {type(prompt).__name__}")
        negative = inputs.get("negative_prompt", params.negative_prompt)
        if negative is not None and not isinstance(negative, str):
            raise InvalidRequestError("negative_prompt", f"expected a string, got {type(negative).__name__}")
        if params.output_type not in _OUTPUT_TYPES:
            raise InvalidRequestError("output_type", f"{params.output_type!r} is not one of {', '.join(_OUTPUT_TYPES)}")
        images = _input_images(inputs, self.adapter.input_image_mode)
        if params.strength is not None and not images:
            raise InvalidRequestError("strength", "given, but the request has no input image (multi_modal_data.image)")
        if params.generator is not None:
            generator = params.generator
        else:
            seed = params.seed if params.seed is not None else random.randrange(2**63)
            generator = torch.Generator("cpu").manual_seed(seed)
        job_class = getattr(self.adapter, "job_class", DiffusionJob)  # a family's typed per-request state
        job = job_class(
            req.request_id,
            prompt,
            negative,
            params,
            images=images or None,
            inputs=dict(inputs),
            generator=generator,
            arrival=req.arrival_time,
            wanted=req.wanted,
        )
        self.adapter.validate(job)
        job.key = self.adapter.batch_key(job)  # the adapter is no part of it: any mix shares a forward
        if params.lora is not None:
            if self.lora is None:
                raise InvalidRequestError(
                    "model", f"{params.lora!r} names a LoRA adapter, but stage {self.stage_id} takes none (enable_lora)"
                )
            job.lora = self.lora.use(params.lora, params.lora_scale)
        return job

    # ------------------------------------------------------------------ loop

    async def _loop(self) -> None:
        while True:
            if not self._sched.has_work:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._burst is not None and not self._sched.running:
                await self._gather(*self._burst)
            self._burst = None
            batch, new = self._sched.next_batch()
            if not batch:
                continue
            now = time.monotonic()
            for j in new:
                j.first_scheduled = now
            self.forward_log.append((batch[0].key, [j.request_id for j in batch]))
            try:
                async with self._step_lock:
                    if self.lora is not None:
                        self.lora.collect()
                    if self._parallel is not None:
                        result = await self._parallel.step(batch, new)
                    else:
                        t0 = time.monotonic()
                        result = await asyncio.to_thread(run_step, self.adapter, batch, new, self.accel.hooks)
                        took = time.monotonic() - t0
                        self._step_s = 0.8 * self._step_s + 0.2 * took if self._step_s else took
            except Exception as e:  # one failed forward fails its batch, not the engine
                logger.exception("diffusion stage %d: step failed", self.stage_id)
                if self._parallel is not None:
                    # the ranks may now disagree on where they are: report unhealthy, and the process-group
                    # launcher fails the requests (naming a rank that died, if one did) and restarts the ranks
                    self._broken = f"rank 0: a step failed ({type(e).__name__}: {e})"
                    return
                for j in batch:
                    self._done(j, error=StageError.failure(e))
                continue
            for j, err in result.failed:
                self._done(j, error=err)
            finished = {id(j) for j, _ in result.finished}
            for j in result.advanced:
                if id(j) not in finished:
                    self._emit(j, StageOutput(j.request_id, self.stage_id, {}, False, progress=(j.step, j.total_steps)))
            for j, data in result.finished:
                self._done(j, data=data)
            if len(result.finished) > 1 and not self._sched.running:  # one finished alone: no burst to expect
                self._burst = (time.monotonic(), len(self._sched.waiting) + len(result.finished))

    async def _gather(self, since: float, expected: int) -> None:
        """Wait, for at most the admission window from ``since``, until ``expected`` requests wait or the
        next batch is full."""
        sched, deadline = self._sched, since + min(self.admit_window_steps * self._step_s, MAX_ADMIT_WINDOW_S)
        while (
            (wait := deadline - time.monotonic()) > 0
            and len(sched.waiting) < expected
            and sum(j.rows for j in sched.waiting) < sched.max_rows
        ):
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                return

    def _done(self, job: DiffusionJob, data: dict | None = None, error: StageError | None = None) -> None:
        self._finish(job, data, error=error, num_steps=job.step, num_steps_reused=steps_reused(job))


def _input_images(inputs: dict[str, Any], mode: str = "RGB") -> list[Image.Image]:
    mm = inputs.get("multi_modal_data") or {}
    if not isinstance(mm, dict):
        raise InvalidRequestError("multi_modal_data", f"expected a dict, got {type(mm).__name__}")
    image = mm.get("image")
    if image is None:
        return []
    images = list(image) if isinstance(image, (list, tuple)) else [image]
    if not images:
        raise InvalidRequestError("multi_modal_data.image", "empty list")
    for i, im in enumerate(images):
        if not isinstance(im, Image.Image):
            raise InvalidRequestError(f"multi_modal_data.image[{i}]", f"expected a PIL image, got {type(im).__name__}")
    return [im.convert(mode) if im.mode != mode else im for im in images]
