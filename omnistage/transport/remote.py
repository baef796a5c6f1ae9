"""What every out-of-process stage engine shares (mp child processes, Ray actors).

``RemoteStageEngine`` is a StageEngine whose real engine runs elsewhere. It
keeps one queue per request, routes the remote's outputs into them, fails the
requests in flight when the remote dies, reports itself unhealthy and starts a
new remote (with backoff, a bounded number of times in a row). Subclasses say
only how they launch the remote and talk to it. ``serve_request`` is the
remote side's loop for one request: the engine's outputs, with an exception
turned into that request's typed error (a ``ValueError`` from validation is the
caller's fault).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from omnistage.errors import StageUnavailableError
from omnistage.pipeline import StageContext
from omnistage.stages.base import (
    StageEngine,
    StageError,
    StageOutput,
    StageRequest,
    StageStats,
)
from omnistage.stages.restart import RESTART_ATTEMPTS, restart_with_backoff

logger = logging.getLogger(__name__)


async def serve_request(engine: StageEngine, req: StageRequest, stage_id: int) -> AsyncIterator[StageOutput]:
    """Run one request on the remote side; the stream always ends with a finished output."""
    try:
        async for out in engine.generate(req):
            yield out
    except Exception as e:  # noqa: BLE001 - reported as this request's error; the engine carries on
        yield StageOutput(req.request_id, stage_id, {}, True, error=StageError.of(e))


class RemoteStageEngine(ABC):
    what = "remote"  # how the remote is named in errors ("process", "Ray actor")

    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.stage_id = ctx.spec.stage_id
        self.restarts = 0
        self._queues: dict[str, asyncio.Queue] = {}
        self._stats = StageStats(healthy=False, detail="starting")
        self._dead: str | None = None
        self._closing = False
        self._watcher: asyncio.Task | None = None

    # ------------------------------------------------------------------ what subclasses provide

    @abstractmethod
    async def _launch(self, payload: bytes) -> None:
        """Start the remote from the pickled StageContext; return once it is ready (raise if it failed)."""

    @abstractmethod
    async def _until_dead(self) -> str:
        """Return (with the reason) when the remote has died."""

    @abstractmethod
    async def _submit(self, req: StageRequest) -> None:
        """Start a request on the remote; its outputs come back through ``_deliver``."""

    @abstractmethod
    async def _send_feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None: ...

    @abstractmethod
    async def _send_abort(self, request_id: str) -> None: ...

    @abstractmethod
    async def _stop(self) -> None:
        """Shut the remote down (gracefully, then by force) and release its resources."""

    async def _until_placeable(self) -> bool:
        """After the restarts failed: return True once a new start may succeed, or False (stay down)."""
        return False

    # ------------------------------------------------------------------ shared behaviour

    def payload(self) -> bytes:
        try:
            return pickle.dumps(self.ctx)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise ValueError(
                f"stage {self.stage_id}: cannot run as a {self.what}: its declaration is not picklable "
                f"({e}); use module-level functions and classes"
            ) from None

    async def start(self) -> None:
        await self._launch(self.payload())
        self._stats = StageStats()
        self._watcher = asyncio.create_task(self._watch(), name=f"stage{self.stage_id}-watch")

    def _deliver(self, out: StageOutput) -> None:
        q = self._queues.get(out.request_id)
        if q is not None:
            q.put_nowait(out)

    def _fail_all(self, message: str) -> None:
        # unavailable: the stage is restarting, so the caller may retry (HTTP 503, not 500)
        for rid, q in list(self._queues.items()):
            q.put_nowait(StageOutput(rid, self.stage_id, {}, True, error=StageError(message, unavailable=True)))

    async def _watch(self) -> None:
        while not self._closing:
            reason = await self._until_dead()
            if self._closing:
                return
            self._dead = f"stage {self.stage_id} {self.what} died ({reason})"
            logger.error("%s; restarting it", self._dead)
            self._stats = StageStats(healthy=False, detail=self._dead)
            self._fail_all(self._dead)
            while not await self._restart():
                # restarts exhausted: down until the remote can be placed again (a Ray node that satisfies its
                # placement joins), then a new round of restarts; an mp child stays down
                if not await self._until_placeable():
                    return
            self._dead = None

    async def _restart(self) -> bool:
        failed = ""

        async def relaunch() -> None:
            nonlocal failed
            self.restarts += 1
            await self._stop()
            try:
                await self._launch(self.payload())
            except Exception as e:
                # /health says why the replica is not back (e.g. no live node its placement allows)
                failed = str(e)
                self._stats = StageStats(healthy=False, detail=f"{self._dead}; restart failed: {e}")
                raise
            self._stats = StageStats()

        if await restart_with_backoff(f"stage {self.stage_id} {self.what}", relaunch):
            return True
        self._stats = StageStats(
            healthy=False, detail=f"{self._dead}; {RESTART_ATTEMPTS} restarts failed, the last: {failed}"
        )
        return False

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        if self._dead:
            raise StageUnavailableError(self._dead)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[req.request_id] = q
        finished = False
        try:
            await self._submit(req)
            while True:
                out = await q.get()
                yield out
                if out.finished:
                    finished = True
                    return
        finally:
            self._queues.pop(req.request_id, None)
            if not finished and not self._dead and not self._closing:
                try:
                    await self._send_abort(req.request_id)  # closed early by the consumer: free the remote's slot
                except StageUnavailableError:
                    pass  # the remote died meanwhile: there is no slot left to free

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        if not self._dead:
            await self._send_feed(request_id, chunk, last)

    async def abort(self, request_id: str) -> None:
        if not self._dead:
            await self._send_abort(request_id)

    def stats(self) -> StageStats:
        return self._stats

    async def shutdown(self) -> None:
        self._closing = True
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        self._fail_all("stage shut down")
        await self._stop()
        self._stats = StageStats(healthy=False, detail="shut down")
