"""Full-duplex sessions offline: audio in, frames out, for as long as the caller keeps the session open.

A duplex pipeline (``moshi``) is one stage whose engine steps every live session one frame at a time; a
session is a stage request with streamed input that never finishes on its own. ``DuplexSession`` is its handle:
``send`` feeds PCM (float32 mono at the model's rate, any length: the engine cuts it into frames), ``recv``
returns the next output frame, ``close`` ends the input (the frames already sent are still stepped and come
out; then the session finishes and its slot is free), ``abort`` drops it at once.

    async with engine.open_duplex({"temperature": 0}) as session:
        await session.send(pcm)
        frame = await session.recv()  # {"audio": float32 [1920], "text_token_ids": [id], "audio_codes": [...]}

``Omni.open_duplex`` wraps it for synchronous scripts (``SyncDuplexSession``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from omnistage.engine.request import new_request_id
from omnistage.stages.base import StageRequest

CLOSED = object()


class DuplexSession:
    def __init__(self, client: Any, params: Mapping[str, Any] | None, session_id: str | None = None):
        self.client = client
        self.id = session_id or new_request_id()
        self.request = StageRequest(self.id, {}, dict(params or {}), stream_inputs=True, session_id=self.id)
        self._outputs: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self.finish_reason: str | None = None

    async def start(self) -> DuplexSession:
        """Open the session: returns once the stage gave it a slot (its first output says so), or raises what the
        stage refused (bad params, named)."""
        self._task = asyncio.create_task(self._pump(), name=f"duplex-{self.id}")
        first = await self._outputs.get()
        if isinstance(first, Exception):
            raise first
        if first is CLOSED or not first.get("session_started"):
            raise RuntimeError(f"duplex session {self.id}: the stage did not start it")
        return self

    async def _pump(self) -> None:
        try:
            async with contextlib.aclosing(self.client.generate(self.request)) as stream:
                async for out in stream:
                    if out.error is not None:
                        await self._outputs.put(out.error.exception(f"duplex session {self.id}: "))
                        return
                    if out.data:
                        await self._outputs.put(out.data)
                    if out.finished:
                        self.finish_reason = out.finish_reason
                        return
        except Exception as e:  # refused (bad params) or the stage failed: the caller's next recv raises it
            await self._outputs.put(e)
        finally:
            await self._outputs.put(CLOSED)

    async def send(self, pcm: np.ndarray) -> None:
        await self.client.feed(self.id, {"pcm": np.asarray(pcm, dtype=np.float32)}, False)

    async def close(self) -> None:
        """No more input: the frames already sent are stepped, then the session finishes."""
        await self.client.feed(self.id, {}, True)

    async def abort(self) -> None:
        await self.client.abort(self.id)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def recv(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next output frame; None once the session has finished."""
        item = await asyncio.wait_for(self._outputs.get(), timeout)
        if item is CLOSED:
            self._outputs.put_nowait(CLOSED)  # every later recv sees the end too
            return None
        if isinstance(item, Exception):
            raise item
        return item

    async def __aenter__(self) -> DuplexSession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.abort()


class SyncDuplexSession:
    """``DuplexSession`` driven from a synchronous caller through ``Omni``'s event loop."""

    def __init__(self, call: Any, session: DuplexSession):
        self._call, self.session = call, session
        self.id = session.id

    def send(self, pcm: np.ndarray) -> None:
        self._call(self.session.send(pcm))

    def recv(self, timeout: float | None = None) -> dict[str, Any] | None:
        return self._call(self.session.recv(timeout))

    def close(self) -> None:
        self._call(self.session.close())

    def abort(self) -> None:
        self._call(self.session.abort())

    def __enter__(self) -> SyncDuplexSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.abort()
