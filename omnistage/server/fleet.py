"""What lets several front-ends share one job store (docs/fleet.md): the leases of the jobs this front-end runs,
and the take-over of jobs whose front-end died.

Every ``poll_s`` the front-end renews the lease of each job it runs; a job it no longer holds (deleted on another
front-end, or taken over after this one could not renew in time) is handed to ``on_lost``, which cancels it here.
Then it looks for queued or running jobs whose lease expired, or that a stopping front-end released, and claims
them one by one (an atomic compare-and-set in the store: of two front-ends exactly one gets each);
``on_claimed`` then re-runs or fails it (``wanted`` says which jobs it takes: none once it is stopping).
``release`` hands a job it will not finish back to the others.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from omnistage.server.errors import APIError, error_response
from omnistage.server.jobs import Claimed, JobStore, StoreUnavailable

logger = logging.getLogger("omnistage.server")


def front_end_id() -> str:
    """This process among the fleet's front-ends (host and pid, for people reading the store; a random part,
    so a restarted process with a reused pid is another owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class JobLeases:
    def __init__(
        self,
        store: JobStore,
        kind: str,
        lease_s: float,
        on_lost: Callable[[str], None],
        on_claimed: Callable[[Claimed], Awaitable[None]],
        wanted: Callable[[dict[str, Any]], bool],
    ):
        self.store, self.kind, self.lease_s = store, kind, lease_s
        self.owner = front_end_id()
        self.held: set[str] = set()
        self.poll_s = min(1.0, lease_s / 3)  # also how soon a DELETE on another front-end stops the job here
        # also how soon a released job is taken: one read of the running jobs of this kind per look
        self.reap_s = self.poll_s
        self._on_lost, self._on_claimed, self._wanted = on_lost, on_claimed, wanted
        self._task: asyncio.Task | None = None
        self._writes: set[asyncio.Task] = set()
        self._failing = False

    def lease_until(self) -> float:
        return time.time() + self.lease_s

    async def start(self) -> None:
        await self.reap()  # jobs left behind by a front-end that died (this one, before a restart, included)
        self._task = asyncio.create_task(self._loop(), name="job-leases")

    def write(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        """Run a job's final write as a task of its own, which ``stop`` waits for (a cancelled job still
        records how it ended before the store closes)."""
        task = asyncio.ensure_future(coro)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def stop(self) -> None:
        if self._writes:
            await asyncio.wait(list(self._writes), timeout=10)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        next_reap = time.monotonic() + self.reap_s
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.renew()
                if time.monotonic() >= next_reap:
                    next_reap = time.monotonic() + self.reap_s
                    await self.reap()
                if self._failing:
                    logger.info("job store %s: reachable again", self.store.url)
                    self._failing = False
            except StoreUnavailable as e:
                if not self._failing:  # once per outage, not once per poll
                    logger.warning("%s (leases are renewed when it is back)", e)
                    self._failing = True
            except Exception:  # a bug here must not stop the leases of every later job
                logger.exception("job leases: poll failed")

    async def renew(self) -> None:
        if not self.held:
            return
        lost = await self.store.renew(self.owner, sorted(self.held), self.lease_until())
        for job_id in lost & self.held:
            self.held.discard(job_id)
            logger.info("job %s: no longer held by this front-end (deleted or taken over): stopping it", job_id)
            self._on_lost(job_id)

    async def release(self, job_id: str, record: dict[str, Any]) -> None:
        """Hand a job this front-end will not finish (it is stopping) to the others, written as ``record``."""
        self.held.discard(job_id)
        if await self.store.release(job_id, self.owner, record):
            logger.info("job %s: handed over to the other front-ends", job_id)

    async def reap(self) -> None:
        now = time.time()
        for record, until in await self.store.running(self.kind):
            if until is not None and until >= now:
                continue  # its front-end holds it
            job_id = record.get("id")
            if not isinstance(job_id, str) or job_id in self.held or not self._wanted(record):
                continue
            claimed = await self.store.claim(job_id, self.owner, time.time(), self.lease_until())
            if claimed is not None:
                self.held.add(job_id)
                why = "lease expired" if until is not None else "unowned (handed over)"
                logger.info("job %s: %s, taken over (attempt %d)", job_id, why, claimed.attempts)
                try:
                    await self._on_claimed(claimed)
                except BaseException:  # not renewed from now on: its lease runs out and it is taken over again
                    self.held.discard(job_id)
                    raise


async def store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """A store that went away: 503 naming it (the request may be retried once it is back)."""
    return error_response(APIError(503, str(exc), code="store_unavailable", headers={"Retry-After": "5"}))


async def probe_stores(settings: Any) -> None:
    """Open and close the job store and the media store a ``ServerSettings`` names: ``StoreUnavailable``
    naming the one that cannot be reached (``omnistage serve`` says so before it loads any model)."""
    from omnistage.server.jobstore import job_store
    from omnistage.server.storage import MediaStore

    store = job_store(settings.job_store_url())
    await store.open()
    await store.close()
    media = MediaStore(settings.storage.model_copy(update={"file_ttl": None}), settings.media_store)
    await media.start()
    await media.stop()
