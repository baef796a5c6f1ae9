"""Admission control: at most ``--max-pending`` generation requests in flight (more get a 503), and the
server's drain on shutdown waits for the admitted ones."""

from __future__ import annotations

import asyncio

from omnistage.server.errors import APIError
from omnistage.server.metrics import ServerMetrics


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
