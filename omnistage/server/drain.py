"""A graceful stop's drain: no new requests, in-flight ones get ``--shutdown-timeout`` to finish, and those
still running then are aborted in every stage and end with a 503 ``shutting_down`` (an SSE or realtime
``error`` event once streaming), before the HTTP server closes the connections."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from omnistage.server.admission import Admission
from omnistage.server.errors import APIError

logger = logging.getLogger("omnistage.server")

# What the requests ended at the grace's end get to abort in every stage and send their 503 (a stage that
# hangs is not waited for: the process exit bound covers it).
CUT_S = 5.0


class Drain:
    """Tracks the running requests (``running``, by id); ``run()`` drains them once, later calls wait for it."""

    def __init__(self, admission: Admission, engine: Any, grace_s: float, retry_after_s: int):
        self.admission, self.engine, self.grace_s, self.retry_after_s = admission, engine, grace_s, retry_after_s
        self.running: set[str] = set()
        self.cut: set[str] = set()  # the requests still running when the grace ran out
        self.deadline: float | None = None  # (event loop time) the grace's end, for video jobs too
        self._done: asyncio.Task | None = None

    def begin(self) -> float:
        """Refuse new work from now on; returns the grace's end."""
        self.admission.closing = True
        if self.deadline is None:
            self.deadline = asyncio.get_running_loop().time() + self.grace_s
        return self.deadline

    async def run(self) -> None:
        if self._done is None:
            self._done = asyncio.ensure_future(self._drain())
        await asyncio.shield(self._done)

    async def _drain(self) -> None:
        left = self.begin() - asyncio.get_running_loop().time()
        if await self.admission.wait_idle(max(0.0, left)):
            return
        self.cut = set(self.running)
        logger.warning(
            "shutdown: %d request(s) still running after --shutdown-timeout %gs; ending them (503 shutting_down)",
            len(self.cut),
            self.grace_s,
        )
        aborts = asyncio.gather(*(self.engine.abort(rid) for rid in self.cut), return_exceptions=True)
        try:
            await asyncio.wait_for(aborts, CUT_S)
        except TimeoutError:
            logger.warning("shutdown: aborting the running requests took over %gs", CUT_S)
        await self.admission.wait_idle(CUT_S)  # their answers are on their way

    def check(self, request_id: str) -> None:
        """Raise the 503 for a request the drain ended (its stream may just end, or end in the abort's error)."""
        if request_id in self.cut:
            raise APIError(
                503,
                f"the server is shutting down: this request was still running when the server's "
                f"--shutdown-timeout of {self.grace_s:g} s ran out; send it again once the server is back",
                code="shutting_down",
                headers={"Retry-After": str(self.retry_after_s)},
            )
