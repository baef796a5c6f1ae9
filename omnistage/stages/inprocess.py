"""Request bookkeeping shared by the engines that run their model in this process (diffusion, generation, ar).

Each engine keeps one item per request (its own type, deriving ``Tracked``) and one output queue for it. This
base owns what is the same for all three: the duplicate-id check, the drain loop of ``generate``, ``abort``
(a final output with ``finish_reason="abort"``), failing every request at shutdown, and the final output's
metrics. A request is *closed* once its final output is queued (finished, failed or aborted) or its consumer
went away: nothing more is emitted for it and no more work runs for it.

An engine fills in ``_new_item`` (check the request, raising ``ValueError``/``InvalidRequestError`` naming the
field before anything is queued), and may override ``_admitted`` (queue the item for its loop), ``_on_close``
(drop it from the loop's queues) and ``_progress`` (the (done, total) steps its outputs carry).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import KW_ONLY, dataclass
from typing import Any, Generic, TypeVar

from omnistage.stages.base import StageError, StageMetrics, StageOutput, StageRequest, peak_memory_mb


@dataclass(eq=False)
class Tracked:
    """What the bookkeeping reads and writes on a request's item; the item also has ``request_id`` and
    ``arrival`` (the monotonic time it was submitted)."""

    _: KW_ONLY
    first_scheduled: float | None = None  # when its first work ran
    closed: bool = False  # its final output is queued, or its consumer left: nothing more is emitted or run


R = TypeVar("R", bound=Tracked)


class InProcessEngine(Generic[R]):
    stage_id: int

    def __init__(self, stage_id: int):
        self.stage_id = stage_id
        self._seats: dict[str, tuple[R, asyncio.Queue[StageOutput]]] = {}

    # ------------------------------------------------------------------ hooks

    def _new_item(self, req: StageRequest) -> R:
        raise NotImplementedError

    def _admitted(self, item: R) -> None:
        """The item has its seat (outputs may be emitted): hand it to the loop."""

    def _on_close(self, item: R) -> None:
        """The item just closed (for any reason): drop it from the loop's queues."""

    def _progress(self, item: R) -> tuple[int, int] | None:
        return None

    # ------------------------------------------------------------------ engine protocol (shared part)

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        rid = req.request_id
        if rid in self._seats:
            raise ValueError(f"request id {rid!r} is already running on stage {self.stage_id}")
        item = self._new_item(req)  # bad input raises here, before any work
        out: asyncio.Queue[StageOutput] = asyncio.Queue()
        self._seats[rid] = (item, out)
        self._admitted(item)
        try:
            while True:
                o = await out.get()
                yield o
                if o.finished:
                    return
        finally:
            if not item.closed:  # the consumer went away: the loop drops it at its next boundary
                item.closed = True
                self._on_close(item)
            if self._seats.get(rid, (None,))[0] is item:
                del self._seats[rid]
            self._left(item)

    def _left(self, item: R) -> None:
        """The request's ``generate`` ended (the item is closed and has no seat): release what it held."""

    async def abort(self, request_id: str) -> None:
        item = self._item(request_id)
        if item is not None:  # the work in flight (if any) finishes; its result for this request is dropped
            self._close(item, self._final(item, finish_reason="abort"))

    def _fail_all(self, message: str = "stage shut down") -> None:
        for item in self._requests():
            self._fail(item, StageError(message))

    # ------------------------------------------------------------------ outputs

    def _item(self, request_id: str) -> R | None:
        seat = self._seats.get(request_id)
        return seat[0] if seat is not None else None

    def _requests(self) -> list[R]:
        """The requests that are not closed, in arrival order."""
        return [item for item, _ in self._seats.values() if not item.closed]

    def _emit(self, item: R, out: StageOutput) -> bool:
        """Queue a non-final output; False (nothing queued) once the request is closed."""
        seat = self._seats.get(item.request_id)
        if item.closed or seat is None or seat[0] is not item:
            return False
        seat[1].put_nowait(out)
        return True

    def _close(self, item: R, out: StageOutput) -> None:
        """Queue the request's final output and close it (nothing, if it is closed already)."""
        if not item.closed:
            self._emit(item, out)
            item.closed = True
            self._on_close(item)

    def _final(self, item: R, data: dict[str, Any] | None = None, **kw: Any) -> StageOutput:
        return StageOutput(item.request_id, self.stage_id, data or {}, True, progress=self._progress(item), **kw)

    def _fail(self, item: R, error: StageError) -> None:
        self._close(item, self._final(item, error=error))

    def _finish(
        self,
        item: R,
        data: dict[str, Any] | None = None,
        *,
        reason: str = "stop",
        error: StageError | None = None,
        num_tokens: int | None = None,
        **metrics: Any,
    ) -> None:
        """The request's last output, with its metrics (``metrics``: the engine's own counts); with ``error``
        it failed after it ran."""
        if item.closed:
            return
        now = time.monotonic()
        first = item.first_scheduled or now
        m = StageMetrics(
            queue_time_s=first - item.arrival,
            run_time_s=now - first,
            num_tokens=num_tokens or 0,
            peak_memory_mb=peak_memory_mb(),
            **metrics,
        )
        reason_ = None if error else reason
        self._close(item, self._final(item, data, metrics=m, error=error, finish_reason=reason_, num_tokens=num_tokens))
