"""stages/ar/engine.py's scheduling promises, on a counting family (the scheduler is what is under test; the
families' numerics are tested against their references in tests/models): a family hook that raises fails its
request alone and the loop serves the next requests; a step whose results do not match its batch fails that
batch only; an abort frees its place in a full batch at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from omnistage.config.schema import StageDeployConfig
from omnistage.pipeline import StageContext, StageSpec
from omnistage.stages.ar.engine import ARRequest, Emit, StepEngine
from omnistage.stages.base import StageRequest


class Counter(StepEngine):
    """Emits ``{"n": i}`` for i = 0 .. inputs["count"]-1 (prefill gives 0). Inputs name the failures to stage:
    ``bad_ready`` / ``bad_prefill_ready`` (the hook raises a RuntimeError), ``wait`` (no next input until fed),
    ``short_step`` (the step returns one result too few)."""

    def load_model(self):
        return object()

    def new_request(self, req: StageRequest) -> ARRequest:
        return ARRequest(req)

    def prefill_ready(self, r: ARRequest) -> bool:
        if r.req.inputs.get("bad_prefill_ready"):
            raise RuntimeError("prefill_ready broke")
        return True

    def prefill(self, r: ARRequest) -> Emit:
        return Emit({"n": 0}, tokens=1, finish="stop" if r.req.inputs["count"] == 1 else None)

    def ready(self, r: ARRequest):
        if r.req.inputs.get("bad_ready"):
            raise RuntimeError("ready broke")
        return None if r.req.inputs.get("wait") else True

    def step(self, rs, items):
        emits = [
            Emit({"n": r.tokens}, tokens=1, finish="stop" if r.tokens + 1 >= r.req.inputs["count"] else None)
            for r in rs
        ]
        return emits[:-1] if any(r.req.inputs.get("short_step") for r in rs) else emits


def engine(max_num_seqs: int = 8) -> Counter:
    spec = StageSpec(stage_id=0, kind="generation", output="audio", final=True)
    return Counter(StageContext(spec, StageDeployConfig(stage_id=0, max_num_seqs=max_num_seqs), None))


async def collect(e: Counter, rid: str, **inputs):
    """(the ``n`` values emitted, the final output's error message or finish reason)."""
    got, end = [], None
    async for out in e.generate(StageRequest(rid, {"count": 3, **inputs}, {})):
        if out.data:
            got.append(out.data["n"])
        if out.finished:
            end = str(out.error) if out.error else out.finish_reason
    return got, end


def run(main):
    async def wrapped():
        return await asyncio.wait_for(main(), 20)  # a hung loop fails the test instead of hanging it

    return asyncio.run(wrapped())


@pytest.mark.parametrize("hook", ["bad_ready", "bad_prefill_ready"])
def test_a_hook_that_raises_fails_its_request_alone_and_the_loop_goes_on(hook):
    async def main():
        e = engine()
        await e.start()
        try:
            bad, good = await asyncio.gather(collect(e, "bad", **{hook: True}), collect(e, "good"))
            after = await collect(e, "after")
        finally:
            await e.shutdown()
        return bad, good, after

    bad, good, after = run(main)
    assert "broke" in bad[1]
    assert good == after == ([0, 1, 2], "stop")


def test_a_step_with_too_few_results_fails_its_batch_not_the_engine():
    async def main():
        e = engine()
        await e.start()
        try:
            short = await asyncio.gather(collect(e, "a", short_step=True), collect(e, "b"))
            after = await collect(e, "after")
        finally:
            await e.shutdown()
        return short, after

    short, after = run(main)
    assert all("step returned 1 results for 2 requests" in end for _, end in short)
    assert after == ([0, 1, 2], "stop")


def test_an_abort_frees_its_place_in_a_full_batch_at_once():
    """One place: a request waiting for input holds it; aborting it lets the queued request in, though nothing
    else happens that would wake the loop."""

    async def main():
        e = engine(max_num_seqs=1)
        await e.start()
        try:
            holder = asyncio.ensure_future(collect(e, "holder", wait=True))
            await asyncio.sleep(0.1)
            queued = asyncio.ensure_future(collect(e, "queued"))
            await asyncio.sleep(0.1)
            assert not queued.done()
            await e.abort("holder")
            return await holder, await queued
        finally:
            await e.shutdown()

    holder, queued = run(main)
    assert holder == ([0], "abort")
    assert queued == ([0, 1, 2], "stop")


def test_requests_arriving_during_a_prefill_take_their_first_step_with_the_others():
    """Requests whose upstream output comes a moment later (the thinker's first tokens a step apart) join in a second
    prefill before the step, so every one's first step is in the same call (no request a step behind)."""
    import threading

    class Slow(Counter):
        started = threading.Event()

        def prefill_batch(self, rs):
            self.started.set()
            time.sleep(0.1)  # the late request arrives meanwhile
            return super().prefill_batch(rs)

    async def main():
        e = Slow(engine().ctx)
        await e.start()
        try:
            first = asyncio.ensure_future(collect(e, "first"))
            await asyncio.to_thread(Slow.started.wait, 5)
            late = asyncio.ensure_future(collect(e, "late"))
            await asyncio.gather(first, late)
        finally:
            await e.shutdown()
        return list(e.prefill_sizes), list(e.batch_sizes)

    prefills, steps = run(main)
    assert prefills == [1, 1] and steps == [2, 2]
