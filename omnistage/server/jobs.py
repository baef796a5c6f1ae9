"""Async jobs that outlive the process: one SQLite table under the storage folder.

Each row is one job as the API shows it (its JSON ``record``), with the
columns the server queries by: ``kind`` (``video`` today; uploaded voices will
be rows of their own kind), ``status``, ``created_at`` and ``file`` (its file
in FileStorage, if any). The server keeps the jobs it serves in memory and
writes a row on every status change; on start it reads them back, so a restart
loses nothing that finished, and a job that was still running when the
process ended is marked failed with the reason.

stdlib ``sqlite3``: one connection used from worker threads under a lock,
one short transaction per write (WAL journal, so readers never wait).
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

logger = logging.getLogger(__name__)

DB_NAME = ".jobs.sqlite3"  # a dot name: FileStorage's sweeper and name rules never touch it
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
RUNNING = ("queued", "in_progress")


class JobStore:
    def __init__(self, folder: str | Path):
        self.path = Path(folder).resolve() / DB_NAME
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def open(self) -> None:
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_SCHEMA)
        self._conn = conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(self._close, conn)

    def _close(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            conn.close()

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self._conn is None:
            raise RuntimeError(f"the job store {self.path} is not open")
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    async def put(
        self, kind: str, job_id: str, status: str, created_at: int, record: dict[str, Any], file: str | None = None
    ) -> None:
        """Insert or replace one job's row."""
        await asyncio.to_thread(
            self._run,
            "INSERT OR REPLACE INTO jobs (id, kind, status, created_at, updated_at, file, record) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job_id, kind, status, int(created_at), time.time(), file, json.dumps(record)),
        )

    async def delete(self, *job_ids: str) -> None:
        for job_id in job_ids:
            await asyncio.to_thread(self._run, "DELETE FROM jobs WHERE id = ?", (job_id,))

    async def load(self, kind: str) -> list[dict[str, Any]]:
        """Every job of ``kind``, oldest first, as recorded."""
        rows = await asyncio.to_thread(
            self._run, "SELECT record FROM jobs WHERE kind = ? ORDER BY created_at, id", (kind,)
        )
        out = []
        for (record,) in rows:
            try:
                out.append(json.loads(record))
            except json.JSONDecodeError:  # a damaged row must not stop the server from starting
                logger.error("job store %s: skipping an unreadable row", self.path)
        return out
