"""A step-batched autoregressive stage engine over a family's model (the talker/backbone shape).

Why not vLLM for these models: each step's input is a frame of several codebooks drawn by
a second, nested autoregressive model (a depth decoder / code predictor) run inside the
step; vLLM's public API has no place for a nested model between steps
(docs/architecture.md, "The step-batched AR engine"; docs/families/qwen_omni.md).

The rhythm (the diffusion engine's): requests join at step boundaries — every request
that is ``prefill_ready`` while fewer than ``max_num_seqs`` are running, all of them in
one ``prefill_batch`` call (requests that arrive together do not queue behind each
other's prefills) — then every step runs one batched call of the family's ``step``
over all running requests that are ``ready`` (a request whose next input has not arrived
waits without holding the batch), and emits what each request produced. Model work runs in a worker thread
(``stages.lane``: on the CPU, a call carrying some request's first output runs alone);
requests fail alone (a failed prefill) or with their batch (a failed step), never the
engine.

A family subclasses ``StepEngine`` and fills in the hooks:

- ``load_model()`` (worker thread, at start): the model object.
- ``new_request(req)`` (event loop): check the request's inputs and params (raise
  ``InvalidRequestError`` naming the field) and return its ``ARRequest`` (subclass it to
  carry per-request state).
- ``prefill_ready(r)``: whether ``r`` has what its prefill needs (default: yes).
- ``prefill(r)`` (worker thread): the prompt's forward; returns the request's first ``Emit``
  (raise to fail the request alone).
- ``prefill_batch(rs)`` (worker thread): the prefills of the requests joining at this step
  boundary, one ``Emit`` or exception (that request fails alone) each; the default runs
  ``prefill`` for each, a family overrides it to run them as one batched forward.
- ``ready(r)``: ``r``'s input for the next step, None while it has none yet (default: ``True``);
  a ``ValueError`` fails the request.
- ``step(rs, items)`` (worker thread): one batched step; returns one ``Emit`` per request.
- ``add_input(r, chunk, last)``: streamed input (``feed``); the default refuses it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omnistage.pipeline import StageContext
from omnistage.stages.base import StageError, StageOutput, StageRequest, StageStats
from omnistage.stages.inprocess import InProcessEngine, Tracked
from omnistage.stages.lane import run_batch_on, stage_device

logger = logging.getLogger(__name__)


@dataclass
class Emit:
    """What one request produced in a prefill or step: a payload delta (None: nothing to send), how many
    tokens (frames) it adds, and the finish reason when the request is done."""

    data: dict[str, Any] | None = None
    tokens: int = 0
    finish: str | None = None


@dataclass(eq=False)
class ARRequest(Tracked):
    req: StageRequest
    prefilled: bool = False
    tokens: int = 0

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def arrival(self) -> float:
        return self.req.arrival_time


class StepEngine(InProcessEngine[ARRequest]):
    def __init__(self, ctx: StageContext):
        super().__init__(ctx.spec.stage_id)
        self.ctx = ctx
        self.max_batch = ctx.deploy.max_num_seqs or 16
        self.model: Any = None
        self.device = "cpu"  # where the model runs (set at start; stages.lane schedules CPU calls)
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._running = 0
        # requests in each recent step (tests and benchmarks read it); bounded: a server runs for months
        self.batch_sizes: deque[int] = deque(maxlen=4096)
        self.prefill_sizes: deque[int] = deque(maxlen=4096)  # requests in each prefill_batch call

    # ------------------------------------------------------------------ hooks

    def load_model(self) -> Any:
        raise NotImplementedError

    def device_and_dtype(self) -> tuple[str, Any]:
        """Where ``load_model`` puts the model: the stage's first GPU in bfloat16 when there is one, else the
        CPU in float32; the deploy's ``dtype`` wins."""
        import torch

        device = stage_device(self.ctx.devices)
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        if self.ctx.deploy.dtype not in (None, "auto"):
            dtype = getattr(torch, str(self.ctx.deploy.dtype))
        return device, dtype

    def new_request(self, req: StageRequest) -> ARRequest:
        raise NotImplementedError

    def prefill_ready(self, r: Any) -> bool:
        return True

    def prefill(self, r: Any) -> Emit:
        raise NotImplementedError

    def prefill_batch(self, rs: list[Any]) -> list[Emit | Exception]:
        out: list[Emit | Exception] = []
        for r in rs:
            try:
                out.append(self.prefill(r))
            except Exception as e:  # this request fails alone
                out.append(e)
        return out

    def ready(self, r: Any) -> Any:
        return True

    def step(self, rs: list[Any], items: list[Any]) -> list[Emit]:
        raise NotImplementedError

    def add_input(self, r: Any, chunk: Mapping[str, Any], last: bool) -> None:
        raise ValueError(f"stage {self.stage_id} takes its whole input at once (no async chunk input)")

    # ------------------------------------------------------------------ engine protocol

    async def start(self) -> None:
        self.device = stage_device(self.ctx.devices)
        self.model = await asyncio.to_thread(self.load_model)
        self._loop_task = asyncio.create_task(self._loop(), name=f"ar-stage-{self.stage_id}")

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._fail_all()

    def stats(self) -> StageStats:
        # not yet scheduled: a request in a running prefill is counted as running, not also as waiting
        waiting = sum(1 for r in self._requests() if not r.prefilled and r.first_scheduled is None)
        return StageStats(queue_depth=waiting, running=self._running, healthy=self.model is not None)

    def _new_item(self, req: StageRequest) -> ARRequest:
        return self.new_request(req)

    def _admitted(self, item: ARRequest) -> None:
        self._wake.set()

    def _on_close(self, item: ARRequest) -> None:
        self._wake.set()  # its place in a full batch is free for a waiting request

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        r = self._item(request_id)
        if r is None or r.closed:
            return  # aborted or failed meanwhile
        self.add_input(r, chunk, last)
        self._wake.set()

    # ------------------------------------------------------------------ outputs

    def _apply(self, r: ARRequest, emit: Emit) -> None:
        if r.closed:
            return
        r.tokens += emit.tokens
        if emit.data:
            self._emit(r, StageOutput(r.request_id, self.stage_id, emit.data, finished=False, num_tokens=r.tokens))
        if emit.finish is not None:
            self._finish(r, reason=emit.finish, num_tokens=r.tokens)

    # ------------------------------------------------------------------ scheduling

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while await self._tick():
                pass

    async def _tick(self) -> bool:
        """One round: prefill the requests that can join, then one batched step. False: nothing to do."""
        did = False
        # Requests that became ready during a prefill join in a second one before the step, so that requests
        # arriving a moment apart (their upstream's first outputs a step apart) take their first step together
        # rather than one step behind the others; at most two, so a stream of arrivals cannot starve the step.
        for _ in range(2):
            if not self._joining() or not await self._prefill():
                break
            did = True
        ready = self._ready()
        if ready:  # a step that gives some request its first token is as urgent as a prefill (stages.lane)
            await self._step(urgent=any(r.tokens == 0 for r, _ in ready))
            did = True
        return did

    def _joining(self) -> list[ARRequest]:
        """The requests that can join now (none while the batch is full: they join when running ones end)."""
        free = self.max_batch - sum(1 for x in self._requests() if x.prefilled)
        joining = [r for r in self._requests() if not r.prefilled and self._hook(self.prefill_ready, r)]
        return joining[: max(0, free)]

    def _ready(self) -> list[tuple[ARRequest, Any]]:
        """The running requests whose next step's input is there, each with that input."""
        ready: list[tuple[ARRequest, Any]] = []
        for r in self._requests():
            if r.closed or not r.prefilled or len(ready) >= self.max_batch:
                continue
            item = self._hook(self.ready, r)
            if item is not None:
                ready.append((r, item))
        return ready

    def _hook(self, hook: Any, r: ARRequest) -> Any:
        """A family's per-request hook on the event loop (``prefill_ready``, ``ready``); one that raises fails
        its request alone (returns None), never the loop every request is waiting on."""
        try:
            return hook(r)
        except Exception as e:
            if not isinstance(e, ValueError):  # ValueError: the request's input is bad; anything else is a bug
                logger.exception("stage %s: %s failed for %s", self.stage_id, hook.__name__, r.request_id)
            self._fail(r, StageError.failure(e))
            return None

    async def _prefill(self) -> bool:
        """Prefill the requests that can join when the call's turn comes (``run_batch_on``); False: none could."""
        rs: list[ARRequest] = []

        def take() -> tuple[list[ARRequest]] | None:
            rs[:] = self._joining()
            if not rs:
                return None
            now = time.monotonic()
            for r in rs:
                r.first_scheduled = now
            self._running = len(rs)
            self.prefill_sizes.append(len(rs))
            return (list(rs),)

        batch_error = None
        try:
            emits = await run_batch_on(self.device, self.prefill_batch, take, urgent=True)  # first outputs: stages.lane
            if emits is None:
                return False
            if len(emits) != len(rs):
                raise RuntimeError(f"prefill_batch returned {len(emits)} results for {len(rs)} requests")
        except Exception as e:  # a failed batched prefill fails its requests, not the engine
            logger.exception("stage %s: prefill failed", self.stage_id)
            batch_error = e
            rs = rs or self._joining()  # (failed before the batch was taken: those it would have taken)
            emits = [e] * len(rs)
        finally:
            self._running = 0
        for r, emit in zip(rs, emits):
            if isinstance(emit, Exception):  # this request fails alone
                if emit is not batch_error and not isinstance(emit, ValueError):
                    logger.error("stage %s: prefill failed for %s", self.stage_id, r.request_id, exc_info=emit)
                self._fail(r, StageError.failure(emit))
                continue
            r.prefilled = True
            self._apply(r, emit)
        return True

    async def _step(self, urgent: bool) -> None:
        """One batched step of the requests that are ready when the call's turn comes (``run_batch_on``)."""
        rs: list[ARRequest] = []

        def take() -> tuple[list[ARRequest], list[Any]] | None:
            ready = self._ready()
            if not ready:
                return None
            rs[:] = [r for r, _ in ready]
            self._running = len(rs)
            self.batch_sizes.append(len(rs))
            return list(rs), [x for _, x in ready]

        try:
            emits = await run_batch_on(self.device, self.step, take, urgent=urgent)
            if emits is None:
                return
            if len(emits) != len(rs):
                raise RuntimeError(f"step returned {len(emits)} results for {len(rs)} requests")
        except Exception as e:  # one bad batch fails its requests, not the engine
            logger.exception("stage %s: step failed", self.stage_id)
            for r in rs or [r for r, _ in self._ready()]:  # (failed before the batch was taken: those it would take)
                self._fail(r, StageError.failure(e))
            return
        finally:
            self._running = 0
        for r, emit in zip(rs, emits):
            self._apply(r, emit)
