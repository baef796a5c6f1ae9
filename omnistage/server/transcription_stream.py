"""A transcript streamed as SSE ``transcript.text.delta`` / ``transcript.text.done`` events: every window of the
audio starts at once, their text deltas go out in window order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi.responses import Response

from omnistage.engine.request import OmniRequest
from omnistage.server.admission import Slot
from omnistage.server.errors import from_engine_error
from omnistage.server.state import ServerState
from omnistage.server.streaming import AbortOnDisconnect, primed, sse, with_error_event
from omnistage.server.transcription_form import TranscriptionForm

Window = tuple[float, float, OmniRequest]  # (start s, end s, the window's engine request)


async def stream_transcript(
    state: ServerState, reqs: list[Window], separator: str, duration: float, form: TranscriptionForm
) -> Response:
    """Every window starts at once; their text deltas go out in window order."""
    queues: list[asyncio.Queue] = [asyncio.Queue() for _ in reqs]
    _END = object()
    slots = _acquire(state, len(reqs))

    async def pump(k: int) -> None:
        prefix = form.prefix()
        try:
            async for out in state.stream(reqs[k][2], slot=slots[k]):
                text = out.delta.get("text")
                if text and prefix is not None:
                    text = prefix.feed(text)
                if text:
                    await queues[k].put(text)
            if prefix is not None and (rest := prefix.feed("", finished=True)):  # held back as a possible prefix
                await queues[k].put(rest)
            await queues[k].put(_END)
        except BaseException as e:  # handed to the reader, which raises it in order
            await queues[k].put(e)
            if isinstance(e, asyncio.CancelledError):
                raise

    pumps = [asyncio.create_task(pump(k)) for k in range(len(reqs))]

    async def events() -> AsyncIterator[str]:
        parts: list[str] = []
        try:
            for k, queue in enumerate(queues):
                pending = separator if k else ""  # goes out with the window's first text (or alone, if none)
                while (item := await queue.get()) is not _END:
                    if isinstance(item, BaseException):
                        raise item
                    item, pending = pending + item, ""
                    parts.append(item)
                    yield sse({"type": "transcript.text.delta", "delta": item, "logprobs": None})
                if pending:  # the joined text is the non-streamed one, empty windows included
                    parts.append(pending)
                    yield sse({"type": "transcript.text.delta", "delta": pending, "logprobs": None})
            yield sse(
                {
                    "type": "transcript.text.done",
                    "text": "".join(parts),
                    "logprobs": None,
                    "usage": {"type": "duration", "seconds": round(duration, 3)},
                }
            )
        finally:
            await _stop(pumps, slots)

    try:
        chunks = await primed(events())  # what the stage refuses at once is still a proper 400
    except BaseException:
        await _stop(pumps, slots)
        raise
    return AbortOnDisconnect(
        with_error_event(chunks, from_engine_error),
        headers={"Cache-Control": "no-cache"},
        media_type="text/event-stream",
    )


def _acquire(state: ServerState, n: int) -> list[Slot]:
    """An admission slot per window, or none (those taken are released) when the server is full."""
    slots = []
    try:
        for _ in range(n):
            slots.append(state.admission.acquire())
    except BaseException:
        for s in slots:
            s.release()
        raise
    return slots


async def _stop(pumps: list[asyncio.Task], slots: list[Slot]) -> None:
    """The windows' pumps stopped, and their slots released."""
    for p in pumps:
        p.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)
    for s in slots:
        s.release()
