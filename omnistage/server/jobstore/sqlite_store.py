"""The job store in one SQLite file (``sqlite:///path``): one machine, any number of front-end processes.

stdlib ``sqlite3`` in WAL mode (readers never wait for the writer), one connection per store used from worker
threads under a lock, one short transaction per write. A claim is a single conditional ``UPDATE`` (the lease
must still be expired when it runs), so of two processes claiming a job exactly one changes the row.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from omnistage.server.jobs import RUNNING, Claimed, JobStore, StoreUnavailable

logger = logging.getLogger(__name__)

DB_NAME = ".jobs.sqlite3"  # a dot name: the media store's sweeper and name rules never touch it
_COLUMNS = {"request": "TEXT", "owner": "TEXT", "lease_until": "REAL", "attempts": "INTEGER NOT NULL DEFAULT 0"}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    file TEXT,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_kind ON jobs (kind, created_at);
"""
_RUNNING_SQL = "status IN ({})".format(", ".join(f"'{s}'" for s in RUNNING))


class SqliteJobStore(JobStore):
    def __init__(self, path: str | Path):
        """``path``: the database file, or a folder to keep it in (as ``.jobs.sqlite3``)."""
        path = Path(path)
        if path.is_dir() or not path.suffix:
            path = path / DB_NAME
        self.path = path.resolve()
        self.url = f"sqlite:///{self.path}"
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def open(self) -> None:
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
            have = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
            for name, sql_type in _COLUMNS.items():  # a store written before leases existed gains their columns
                if name not in have:
                    conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {sql_type}")
        except (OSError, sqlite3.Error) as e:
            raise StoreUnavailable(f"the job store {self.url} cannot be opened: {e}") from None
        self._conn = conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(self._close, conn)

    def _close(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            conn.close()

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self._exec(sql, args)[0]

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> tuple[list[tuple[Any, ...]], int]:
        if self._conn is None:
            raise StoreUnavailable(f"the job store {self.url} is not open")
        try:
            with self._lock:
                cursor = self._conn.execute(sql, args)
                return cursor.fetchall(), cursor.rowcount
        except sqlite3.OperationalError as e:  # locked past the timeout, disk gone, ...
            raise StoreUnavailable(f"the job store {self.url} failed: {e}") from None

    async def _call(self, sql: str, args: tuple[Any, ...] = ()) -> tuple[list[tuple[Any, ...]], int]:
        return await asyncio.to_thread(self._exec, sql, args)

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
        await self._call(
            "INSERT OR REPLACE INTO jobs (id, kind, status, created_at, updated_at, file, record, request, owner, "
            "lease_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job_id,
                kind,
                status,
                int(created_at),
                time.time(),
                file,
                json.dumps(record),
                None if request is None else json.dumps(request),
                owner,
                lease_until,
            ),
        )

    async def update(
        self, job_id: str, owner: str, status: str, record: dict[str, Any], file: str | None = None
    ) -> bool:
        _, changed = await self._call(
            "UPDATE jobs SET status = ?, updated_at = ?, file = ?, record = ? WHERE id = ? AND owner = ?",
            (status, time.time(), file, json.dumps(record), job_id, owner),
        )
        return changed == 1

    async def get(self, job_id: str) -> dict[str, Any] | None:
        rows, _ = await self._call("SELECT record FROM jobs WHERE id = ?", (job_id,))
        return _decode(rows[0][0], self.url) if rows else None

    async def load(self, kind: str) -> list[dict[str, Any]]:
        rows, _ = await self._call("SELECT record FROM jobs WHERE kind = ? ORDER BY created_at, id", (kind,))
        return [r for (text,) in rows if (r := _decode(text, self.url)) is not None]

    async def delete(self, *job_ids: str) -> None:
        for job_id in job_ids:
            await self._call("DELETE FROM jobs WHERE id = ?", (job_id,))

    async def renew(self, owner: str, job_ids: list[str], lease_until: float) -> set[str]:
        lost = set()
        for job_id in job_ids:
            _, changed = await self._call(
                "UPDATE jobs SET lease_until = ? WHERE id = ? AND owner = ?", (lease_until, job_id, owner)
            )
            if changed != 1:
                lost.add(job_id)
        return lost

    async def claim(self, job_id: str, owner: str, now: float, lease_until: float) -> Claimed | None:
        # (the right-hand sides read the row as it was: a released job, with no owner, costs no attempt)
        _, changed = await self._call(
            "UPDATE jobs SET owner = ?, lease_until = ?, attempts = attempts + (owner IS NOT NULL) "
            f"WHERE id = ? AND {_RUNNING_SQL} AND (lease_until IS NULL OR lease_until < ?)",
            (owner, lease_until, job_id, now),
        )
        if changed != 1:
            return None
        rows, _ = await self._call(
            "SELECT record, request, attempts FROM jobs WHERE id = ? AND owner = ?", (job_id, owner)
        )
        if not rows:  # deleted between the two statements
            return None
        record, request, attempts = rows[0]
        return Claimed(json.loads(record), None if request is None else json.loads(request), int(attempts))

    async def release(self, job_id: str, owner: str, record: dict[str, Any]) -> bool:
        _, changed = await self._call(
            "UPDATE jobs SET status = 'queued', updated_at = ?, record = ?, owner = NULL, lease_until = NULL "
            "WHERE id = ? AND owner = ?",
            (time.time(), json.dumps(record), job_id, owner),
        )
        return changed == 1

    async def running(self, kind: str) -> list[tuple[dict[str, Any], float | None]]:
        rows, _ = await self._call(
            f"SELECT record, lease_until FROM jobs WHERE kind = ? AND {_RUNNING_SQL} ORDER BY created_at, id", (kind,)
        )
        return [(r, until) for text, until in rows if (r := _decode(text, self.url)) is not None]


def _decode(text: str, url: str) -> dict[str, Any] | None:
    try:
        return json.loads(text)
    except json.JSONDecodeError:  # a damaged row must not stop the server
        logger.error("job store %s: skipping an unreadable row", url)
        return None
