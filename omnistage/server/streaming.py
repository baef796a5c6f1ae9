"""Streaming responses that notice a client going away even while the
generator is waiting for the engine, so the request is aborted in every
stage at once. (Starlette does this itself only for ASGI servers older than
spec 2.4; for newer ones it would notice only on the next write, which for a
diffusion request may be minutes later.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import StreamingResponse

_END = object()


class BrokenOff(Exception):
    """A raw byte stream failed after its response started."""


class AbortOnDisconnect(StreamingResponse):
    """The body generator runs in its own asyncio task, fed to the client
    through a one-slot queue. When the client leaves, that task is cancelled
    once (asyncio's edge-triggered cancel), so the generator's cleanup can
    await the engine's abort; inside anyio's cancelled scope every such await
    would be cancelled again and the abort could be lost."""

    def __init__(self, content: Any, *, on_close: Any = None, **kwargs: Any):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        queue: asyncio.Queue = asyncio.Queue(maxsize=1)
        producer = asyncio.create_task(self._produce(queue))
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    try:
                        await self._send_all(queue, send)
                    except OSError:  # the client went away mid-write
                        pass
                    tg.cancel_scope.cancel()

                async def listen() -> None:
                    await self.listen_for_disconnect(receive)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                tg.start_soon(listen)
        finally:
            producer.cancel()  # a no-op when the body finished; otherwise this aborts the request
            await asyncio.gather(producer, return_exceptions=True)
            if self._on_close is not None:
                self._on_close()

    async def _produce(self, queue: asyncio.Queue) -> None:
        try:
            async for chunk in self.body_iterator:
                await queue.put(chunk)
        except Exception as e:  # noqa: BLE001 - re-raised on the sending side
            await queue.put(e)
            return
        await queue.put(_END)

    async def _send_all(self, queue: asyncio.Queue, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        while (item := await queue.get()) is not _END:
            if isinstance(item, BrokenOff):
                return  # no end of body: the server closes the connection, the client sees the body incomplete
            if isinstance(item, BaseException):
                raise item
            chunk = item if isinstance(item, (bytes, memoryview)) else item.encode(self.charset)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def primed(stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Wait for a stream's first item before the response starts: what a stage refuses at once (bad input
    only the stage can judge: a media limit, a chat template error) is then a proper HTTP error, not an
    error event after a 200. Returns an iterator over every item, first included."""
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = _END

    async def everything() -> AsyncIterator[Any]:
        try:
            if first is not _END:
                yield first
                async for item in stream:
                    yield item
        finally:
            await stream.aclose()

    return everything()


def sse(data: Any) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


async def with_error_event(gen: AsyncIterator[str], to_error: Any) -> AsyncIterator[str]:
    """Errors after the response started cannot change the status: send them as an SSE error event."""
    try:
        async for item in gen:
            yield item
    except Exception as e:  # noqa: BLE001 - every failure must reach the client as an event
        yield sse(to_error(e).body())
        yield SSE_DONE
    finally:
        await gen.aclose()  # runs the inner generator's finally (abort) now


async def end_on_error(gen: AsyncIterator[Any], log: Any) -> AsyncIterator[Any]:
    """For raw byte streams (no event framing): log a failure and break the response off. Ending it the normal
    way would pass a truncated body (audio cut by a dying stage) off as a complete one; a response with no end
    of body is one every HTTP client reports as incomplete."""
    try:
        async for item in gen:
            yield item
    except Exception as e:  # noqa: BLE001
        log.error("stream failed: %s: %s", type(e).__name__, e)
        raise BrokenOff(str(e)) from None
    finally:
        await gen.aclose()
