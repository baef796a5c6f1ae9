"""Streaming responses that notice a client going away even while the
generator is waiting for the engine (not only on the next write), so the
request is aborted in every stage at once."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

import anyio
from starlette.responses import StreamingResponse


class AbortOnDisconnect(StreamingResponse):
    def __init__(self, content: Any, *, on_close: Any = None, **kwargs: Any):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self._run(scope, receive, send)
        finally:
            if self._on_close is not None:
                self._on_close()

    async def _run(self, scope: Any, receive: Any, send: Any) -> None:
        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                try:
                    await self.stream_response(send)
                except OSError:  # the client went away mid-write
                    pass
                tg.cancel_scope.cancel()

            async def listen() -> None:
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()

            tg.start_soon(stream)
            tg.start_soon(listen)
        # Close the generator now (its finally aborts the request), not whenever it is collected.
        aclose = getattr(self.body_iterator, "aclose", None)
        if aclose is not None:
            await aclose()


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
