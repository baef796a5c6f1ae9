"""The media store: where async outputs (video MP4s) live, through fsspec (``--media-store``).

``file:///path`` (the default: the storage folder) or ``s3://bucket/prefix`` with s3fs, which takes its endpoint
and credentials from the usual AWS environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...).
Every front-end of a fleet pointing at the same store serves the same files. Names are validated (one path
component, no dot names), so an id sent by a client can never reach another key. File operations are bounded by
``file_concurrency``; with a ``file_ttl`` (retention) a sweeper deletes expired files.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import fsspec

from omnistage.config.settings import StorageSettings
from omnistage.server.jobs import StoreUnavailable

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class InvalidName(ValueError):
    pass


class MediaStore:
    def __init__(
        self,
        settings: StorageSettings,
        url: str | None = None,
        on_expired: Callable[[list[str]], None] | None = None,
    ):
        self.url = url or Path(settings.path).resolve().as_uri()
        options = {"use_listings_cache": False} if self.url.startswith("s3://") else {}  # others write there too
        self.fs, root = fsspec.core.url_to_fs(self.url, **options)
        self.local = "file" in _protocols(self.fs)
        self.root = str(Path(root).resolve()) if self.local else root.rstrip("/")
        self.ttl = settings.file_ttl
        self.sweep_interval = settings.ttl_sweep_interval
        self._sem = asyncio.Semaphore(settings.file_concurrency)
        self._on_expired = on_expired
        self._sweeper: asyncio.Task | None = None

    def key_for(self, name: str) -> str:
        """The file's path in the store; ``InvalidName`` for anything but one plain path component."""
        if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
            raise InvalidName(f"invalid file name {name!r}")
        return f"{self.root}/{name}"

    def local_path(self, name: str) -> Path | None:
        """The file on this machine's disk (a ``file://`` store), else None."""
        return Path(self.key_for(name)) if self.local else None

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self._sem:
            try:
                return await asyncio.to_thread(fn, *args)
            except (FileNotFoundError, InvalidName):
                raise
            except Exception as e:  # noqa: BLE001 - network, credentials, a bucket gone: one clear error
                raise StoreUnavailable(f"the media store {self.url} failed: {type(e).__name__}: {e}") from None

    async def start(self) -> None:
        """Make the folder (``file://``), or check that the bucket answers: ``StoreUnavailable`` naming the URL."""
        try:
            if self.local:
                await asyncio.to_thread(os.makedirs, self.root, exist_ok=True)
            else:
                await asyncio.to_thread(self.fs.ls, self.root.split("/", 1)[0])
        except Exception as e:  # noqa: BLE001
            raise StoreUnavailable(f"the media store {self.url} is unreachable: {type(e).__name__}: {e}") from None
        if self.ttl is not None and self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="storage-ttl-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    async def save(self, name: str, data: bytes) -> str:
        """Write the file once, whole (readers never see part of it); returns its key."""
        key = self.key_for(name)
        await self._io(self._write, key, data)
        return key

    def _write(self, key: str, data: bytes) -> None:
        if not self.local:
            self.fs.pipe_file(key, data)  # one PUT: the object appears whole
            return
        tmp = Path(key).with_name(f".{Path(key).name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, key)

    async def size(self, name: str) -> int | None:
        """The file's size if it exists (and has not expired); an expired one is deleted."""
        key = self.key_for(name)
        try:
            info = await self._io(self.fs.info, key)
        except FileNotFoundError:
            return None
        if self._expired(info, time.time()):
            await self.delete(name)
            return None
        return int(info["size"])

    async def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the file."""
        return await self._io(self.fs.cat_file, self.key_for(name), start, end)

    async def delete(self, name: str) -> bool:
        key = self.key_for(name)
        try:
            await self._io(self.fs.rm_file, key)
            return True
        except FileNotFoundError:
            return False

    def presign(self, name: str, expires_s: int) -> str | None:
        """A URL that fetches the file without credentials for ``expires_s`` (s3), or None where the store
        has none (``file://``)."""
        if self.local:
            return None
        return self.fs.sign(self.key_for(name), expiration=expires_s)

    def _expired(self, info: dict[str, Any], now: float) -> bool:
        if self.ttl is None:
            return False
        return now - _mtime(info) > self.ttl

    async def sweep(self) -> list[str]:
        """Delete every expired file; returns their names."""
        if self.ttl is None:
            return []
        now = time.time()
        try:
            entries = await self._io(self.fs.ls, self.root, True)
        except FileNotFoundError:
            return []
        removed = []
        for info in entries:
            name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
            if info.get("type") != "file" or name.startswith(".") or not _NAME.match(name):
                continue
            if self._expired(info, now) and await self.delete(name):
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


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _mtime(info: dict[str, Any]) -> float:
    """Modification time in epoch seconds: ``mtime`` on a local disk, ``LastModified`` on S3."""
    value = info.get("mtime", info.get("LastModified", info.get("last_modified")))
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value) if value is not None else time.time()
