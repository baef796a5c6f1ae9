"""Generic batched engine for one-shot or chunked non-autoregressive modules
(codec decoders, vocoders, VAE decoders, encoders).

The family supplies an adapter; the engine owns batching, streaming input
(async chunk), aborts and metrics:

    class MyAdapter:
        def __init__(self, ctx: StageContext): ...            # load weights
        def run(self, items: list[GenerationItem]) -> list[dict]: ...   # one batched call

Each item is one request's next input chunk; ``item.state`` persists across a
request's chunks (e.g. a decoder's left context). A request that ran always gets
one call with ``item.last`` set: if the end arrives after its last chunk ran, an
extra call with an empty chunk (``{}``) — an adapter that holds something back
for the end (a non-causal codec's last block) flushes it then. The adapter returns one
output delta per item, or an exception instance for an item that failed
(that request fails alone; a ``ValueError`` means the request was bad).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from omnistage.pipeline import StageContext
from omnistage.stages.base import StageError, StageOutput, StageRequest, StageStats
from omnistage.stages.generation.adapter import GenerationAdapter, GenerationItem
from omnistage.stages.inprocess import InProcessEngine, Tracked
from omnistage.stages.lane import run_on, stage_device


@dataclass(eq=False)
class GenerationRequest(Tracked):
    req: StageRequest
    chunks: deque = field(default_factory=deque)  # pending input chunks
    inputs_done: bool = False  # upstream said last=True (or inputs were whole)
    state: dict[str, Any] = field(default_factory=dict)
    ran: bool = False  # the adapter got a chunk of it
    told_last: bool = False  # ... and one of them was marked last

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def arrival(self) -> float:
        return self.req.arrival_time


class GenerationStageEngine(InProcessEngine[GenerationRequest]):
    def __init__(self, ctx: StageContext, adapter: GenerationAdapter | None = None):
        super().__init__(ctx.spec.stage_id)
        self.ctx = ctx
        self.max_batch = ctx.deploy.max_num_seqs or 8
        self.adapter = adapter  # public: tests and tools inspect it
        self.device = "cpu"  # where the adapter runs (set at start)
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._running = 0
        self._batch: set[str] = set()  # request ids in the batch running now
        self._healthy = True

    async def start(self) -> None:
        if self.adapter is None:
            if self.ctx.spec.adapter is None:
                raise ValueError(f"stage {self.stage_id}: generation stage declares no adapter")
            self.adapter = await asyncio.to_thread(self.ctx.spec.adapter, self.ctx)
        # the adapters' rule for their device (on the CPU, a call with a request's first piece runs alone: lane.py)
        self.device = stage_device(self.ctx.devices)
        self._loop_task = asyncio.create_task(self._loop(), name=f"generation-stage-{self.stage_id}")

    def _new_item(self, req: StageRequest) -> GenerationRequest:
        r = GenerationRequest(req)
        if req.inputs:
            r.chunks.append(req.inputs)
        r.inputs_done = not req.stream_inputs
        return r

    def _admitted(self, item: GenerationRequest) -> None:
        self._wake.set()

    def _on_close(self, item: GenerationRequest) -> None:
        item.chunks.clear()

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        r = self._item(request_id)
        if r is None or r.closed:
            return  # aborted or failed meanwhile
        if r.inputs_done:
            raise ValueError(f"stage {self.stage_id}: input fed to {request_id!r} after its last chunk")
        if chunk:
            r.chunks.append(chunk)
        r.inputs_done = last
        self._wake.set()

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._fail_all()

    def stats(self) -> StageStats:
        # a request in the running batch has had its chunk taken already: only the others wait
        waiting = sum(1 for r in self._requests() if r.chunks and r.request_id not in self._batch)
        return StageStats(queue_depth=waiting, running=self._running, healthy=self._healthy)

    # ------------------------------------------------------------------ loop

    def _finish_ready(self) -> None:
        """A request finishes only once its upstream is done *and* every fed chunk is consumed."""
        for r in self._requests():
            if r.inputs_done and not r.chunks and r.first_scheduled is not None:
                self._finish(r)

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                # A request that was started with nothing yet to do is "scheduled" when its first chunk runs;
                # one whose inputs are already complete and empty finishes at once.
                for r in self._requests():
                    if r.first_scheduled is None and r.inputs_done and not r.chunks:
                        r.first_scheduled = time.monotonic()
                    if r.ran and not r.told_last and r.inputs_done and not r.chunks:
                        # the end came after its last chunk ran (an empty last feed): one more, empty, call marked
                        # last, for adapters that hold something back until then (a non-causal codec's last block)
                        r.chunks.append({})
                self._finish_ready()
                ready = [r for r in self._requests() if r.chunks][: self.max_batch]
                if not ready:
                    break
                urgent = any(r.first_scheduled is None for r in ready)  # some request's first piece (stages.lane)
                items = []
                for r in ready:
                    chunk = r.chunks.popleft()
                    if r.first_scheduled is None:
                        r.first_scheduled = time.monotonic()
                    last = r.inputs_done and not r.chunks
                    r.ran, r.told_last = True, last
                    items.append(GenerationItem(r.request_id, chunk, r.req.params, r.state, last))
                self._running, self._batch = len(items), {r.req.request_id for r in ready}
                try:
                    results = await run_on(self.device, self.adapter.run, items, urgent=urgent)
                    if len(results) != len(items):
                        raise RuntimeError(f"adapter returned {len(results)} outputs for {len(items)} inputs")
                except Exception as e:  # one bad batch fails its requests, not the engine
                    for r in ready:
                        self._fail(r, StageError.failure(e))
                    continue
                finally:
                    self._running, self._batch = 0, set()
                for r, data in zip(ready, results):
                    if isinstance(data, Exception):
                        self._fail(r, StageError.of(data))
                    elif data:
                        self._emit(r, StageOutput(r.request_id, self.stage_id, data, finished=False))
