"""The job store: where async jobs (videos) and other records (uploaded voices) live, shared by every front-end
that points at it (docs/fleet.md).

One row per job: its ``kind`` (``video``, ``voice``), ``status``, ``created_at``, the JSON ``record`` the API
shows, the ``request`` that made it (what another front-end needs to run it again), and the front-end that runs
it (``owner``) with its lease expiry (``lease_until``, epoch seconds). A front-end renews the leases of the jobs
it runs; a job whose lease expired is taken by another front-end with an atomic compare-and-set (``claim``), so
two front-ends never run the same job at once. Writes by a job's runner are conditional on still owning it
(``update``): a job deleted elsewhere is never written back, and its runner learns it lost it (``renew``). A
front-end that stops gracefully hands the jobs it has not finished back (``release``): unowned and without a
lease, they are claimed by the next front-end that looks, without counting as a failed attempt.

Implementations: ``jobstore/sqlite_store.py`` (one machine), ``jobstore/redis_store.py`` (a fleet). A store
that cannot be reached raises ``StoreUnavailable`` naming its URL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

RUNNING = ("queued", "in_progress")


class StoreUnavailable(RuntimeError):
    """The job store (or media store) could not be reached; the message names it."""


@dataclass
class Claimed:
    """A job this front-end took over: its record, the stored request (None if none was kept) and how many
    front-ends have taken it so far (this one included)."""

    record: dict[str, Any]
    request: dict[str, Any] | None
    attempts: int


class JobStore(ABC):
    url: str

    @abstractmethod
    async def open(self) -> None:
        """Connect (and create what is missing); ``StoreUnavailable`` if the store cannot be reached."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def put(
        self,
        kind: str,
        job_id: str,
        status: str,
        created_at: int,
        record: dict[str, Any],
        file: str | None = None,
        *,
        owner: str | None = None,
        lease_until: float | None = None,
        request: dict[str, Any] | None = None,
    ) -> None:
        """Insert or replace one row (a new job, or a record nobody runs)."""

    @abstractmethod
    async def update(
        self, job_id: str, owner: str, status: str, record: dict[str, Any], file: str | None = None
    ) -> bool:
        """Write a running job's new state if ``owner`` still holds it; False (nothing written) if the row is
        gone or another front-end took it."""

    @abstractmethod
    async def get(self, job_id: str) -> dict[str, Any] | None:
        """One job's record, or None."""

    @abstractmethod
    async def load(self, kind: str) -> list[dict[str, Any]]:
        """Every record of ``kind``, oldest first (``created_at``, then id)."""

    @abstractmethod
    async def delete(self, *job_ids: str) -> None: ...

    @abstractmethod
    async def renew(self, owner: str, job_ids: list[str], lease_until: float) -> set[str]:
        """Extend the leases ``owner`` holds; returns the ids it no longer holds (deleted, or taken)."""

    @abstractmethod
    async def claim(self, job_id: str, owner: str, now: float, lease_until: float) -> Claimed | None:
        """Take a running job whose lease expired before ``now`` (or that has none): atomic, so of two
        front-ends claiming it one wins; None when the job is not (or no longer) up for taking. Taking it from
        a front-end that held it counts as an attempt; taking a released one does not."""

    @abstractmethod
    async def release(self, job_id: str, owner: str, record: dict[str, Any]) -> bool:
        """Hand a job ``owner`` runs over to the fleet: write ``record`` (queued again) and leave it unowned,
        with no lease, so the next front-end that looks claims it at once. False if ``owner`` no longer held it."""

    async def expired(self, kind: str, now: float) -> list[dict[str, Any]]:
        """Records of ``kind`` still queued or running whose lease expired before ``now`` (or that have none)."""
        return [record for record, until in await self.running(kind) if (until or 0) < now]

    @abstractmethod
    async def running(self, kind: str) -> list[tuple[dict[str, Any], float | None]]:
        """(record, lease_until) of every row of ``kind`` that is queued or in progress."""


def parse_lease(value: Any) -> float | None:
    return None if value in (None, "", b"") else float(value)
