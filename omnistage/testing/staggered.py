"""Diffusion batching checks through the public API: the same requests alone, then together, each joining
the running batch at a different step (``AsyncOmni`` with one diffusion stage, in process).

    solo, together, forwards = await solo_then_staggered(omni, [(prompt, params), ...])

``forwards`` lists the request ids of every forward the concurrent run made (the stage engine's
``forward_log``), so a test can show the requests really shared forwards after joining at different steps.
It is empty for an engine that runs in other processes (no ``forward_log`` here), e.g. a multi-device
replica.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from typing import Any

_ids = itertools.count()


async def _run(
    omni: Any, rid: str, prompt: str | Mapping[str, Any], params: dict[str, Any], started: asyncio.Event | None = None
) -> Any:
    """The finished output; ``started`` is set once the request has done a step (or finished)."""
    last = None
    try:
        async for last in omni.generate(prompt, request_id=rid, sampling_params_list=[params]):
            if started is not None and last.progress and last.progress[0] >= 1:
                started.set()
    finally:
        if started is not None:
            started.set()
    if last is None or not last.finished:
        raise AssertionError(f"request {rid} ended without a finished output")
    if last.error is not None:
        raise AssertionError(f"request {rid} failed: {last.error}")
    return last


async def generate_final(omni: Any, prompt: str | Mapping[str, Any], params: dict[str, Any]) -> Any:
    """One request's finished output (errors raised, a failed request is an AssertionError)."""
    return await _run(omni, f"solo-{next(_ids)}", prompt, params)


async def solo_then_staggered(
    omni: Any, specs: list[tuple[str | Mapping[str, Any], dict[str, Any]]], stage_id: int = 0, solo: int | None = None
) -> tuple[list[Any], list[Any], list[list[str]]]:
    """Each (prompt, stage params) alone (only the first ``solo`` of them, if given), then all concurrently,
    each submitted once the previous one has done a step. Returns (solo finished outputs, concurrent finished
    outputs, in spec order; the request ids of every forward of the concurrent run)."""
    alone = [await generate_final(omni, p, kw) for p, kw in specs[:solo]]
    log = getattr(omni.replicas(stage_id)[0], "forward_log", None)
    if log is not None:
        log.clear()
    tasks, prev = [], None
    for p, kw in specs:
        if prev is not None:
            await prev.wait()
        prev = asyncio.Event()
        tasks.append(asyncio.create_task(_run(omni, f"stag-{next(_ids)}", p, kw, started=prev)))
    together = await asyncio.gather(*tasks)
    return alone, list(together), [list(ids) for _, ids in (log or [])]
