"""One request run to its end, for tests and benchmarks.

Any ``generate`` stream goes in — ``AsyncOmni.generate(...)`` (``OmniRequestOutput`` updates) or a stage
engine's ``generate(StageRequest(...))`` (``StageOutput`` updates) — and its updates come out. Errors the
stream raises (``InvalidRequestError``, ``StageFailedError``) propagate to the caller unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Iterable, Mapping
from typing import Any, Protocol, TypeVar


class Update(Protocol):
    finished: bool
    stage_id: int


U = TypeVar("U", bound=Update)


async def all_outputs(stream: AsyncIterable[U]) -> list[U]:
    """Every update of the request, in the order the stream gave them."""
    return [o async for o in stream]


def stage_request(request_id: str, prompt: Mapping[str, Any], params: Any, **kw: Any) -> Any:
    """A stage request for a prompt, as the orchestrator makes a source stage's: the prompt's ``speech`` (a
    ``SpeechInput`` or a mapping of its fields, checked as at admission) becomes the request's typed field."""
    from omnistage.speech import check_speech
    from omnistage.stages.base import StageRequest

    inputs = dict(prompt)
    speech = inputs.pop("speech", None)
    return StageRequest(request_id, inputs, params, speech=check_speech(speech) if speech is not None else None, **kw)


async def fed_outputs(
    engine: Any,
    request_id: str,
    inputs: Mapping[str, Any],
    params: Any,
    feeds: list[tuple[dict[str, Any], bool]] | None,
    gap_s: float = 0.01,
) -> list[Any]:
    """A started stage engine's updates for one request: ``inputs`` whole (``feeds`` None), or its first chunk with
    the ``(chunk, last)`` feeds following ``gap_s`` apart (the engine runs ahead of them: it must wait, not guess)."""
    req = stage_request(request_id, inputs, params, stream_inputs=feeds is not None)
    task = asyncio.ensure_future(all_outputs(engine.generate(req)))
    for chunk, last in feeds or []:
        await asyncio.sleep(gap_s)
        await engine.feed(request_id, chunk, last)
    return await task


async def final_output(stream: AsyncIterable[U]) -> U:
    """The request's last update; it must be a finished one (a stream that just stops is a bug to see)."""
    last = None
    async for last in stream:  # noqa: B007 (the loop keeps the last update)
        pass
    if last is None:
        raise AssertionError("the stream ended without any output")
    if not last.finished:
        raise AssertionError(f"the stream ended on an unfinished update: {last!r}")
    return last


def finished_by_stage(outputs: Iterable[U]) -> dict[int, U]:
    """Each stage's finished update (a pipeline with several final stages finishes once per stage)."""
    return {o.stage_id: o for o in outputs if o.finished}
