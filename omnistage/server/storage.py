"""Files the server keeps between requests (async video outputs).

Names are validated and resolved strictly inside the storage folder, so an id
sent by a client can never reach another path. File operations are bounded by
``file_concurrency``; with a ``file_ttl`` a sweeper deletes expired files.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from omnistage.config.settings import StorageSettings

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class InvalidName(ValueError):
    pass


class FileStorage:
    def __init__(self, settings: StorageSettings, on_expired: Callable[[list[str]], None] | None = None):
        self.root = Path(settings.path).resolve()
        self.ttl = settings.file_ttl
        self.sweep_interval = settings.ttl_sweep_interval
        self._sem = asyncio.Semaphore(settings.file_concurrency)
        self._on_expired = on_expired
        self._sweeper: asyncio.Task | None = None

    def path_for(self, name: str) -> Path:
        if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
            raise InvalidName(f"invalid file name {name!r}")
        path = (self.root / name).resolve()
        if path.parent != self.root:  # belt and braces: never outside the storage folder
            raise InvalidName(f"invalid file name {name!r}")
        return path

    async def start(self) -> None:
        await asyncio.to_thread(self.root.mkdir, parents=True, exist_ok=True)
        if self.ttl is not None and self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="storage-ttl-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    async def save(self, name: str, data: bytes) -> Path:
        path = self.path_for(name)
        async with self._sem:
            await asyncio.to_thread(_atomic_write, path, data)
        return path

    async def open(self, name: str) -> Path | None:
        """The file's path if it exists (and has not expired)."""
        path = self.path_for(name)
        async with self._sem:
            exists = await asyncio.to_thread(path.is_file)
        if exists and self._expired(path, time.time()):
            await self.delete(name)
            return None
        return path if exists else None

    async def delete(self, name: str) -> bool:
        path = self.path_for(name)
        async with self._sem:
            try:
                await asyncio.to_thread(path.unlink)
                return True
            except FileNotFoundError:
                return False

    def _expired(self, path: Path, now: float) -> bool:
        if self.ttl is None:
            return False
        try:
            return now - path.stat().st_mtime > self.ttl
        except FileNotFoundError:
            return False

    async def sweep(self) -> list[str]:
        """Delete every expired file; returns their names."""
        if self.ttl is None:
            return []
        now = time.time()
        names = await asyncio.to_thread(
            lambda: [p.name for p in self.root.iterdir() if p.is_file()] if self.root.is_dir() else []
        )
        removed = []
        for name in names:
            if name.startswith(".") or not _NAME.match(name):
                continue
            path = self.root / name
            if self._expired(path, now) and await self.delete(name):
                removed.append(name)
        if removed:
            logger.info("storage: deleted %d expired file(s)", len(removed))
            if self._on_expired is not None:
                self._on_expired(removed)
        return removed

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval or 300)
            try:
                await self.sweep()
            except Exception:  # a failed sweep must not kill the sweeper
                logger.exception("storage sweep failed")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
