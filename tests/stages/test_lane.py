"""stages/lane.py: in-process CPU model calls overlap, except one carrying a request's first output, which runs
alone (after the calls in progress, before the calls that wait)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from omnistage.stages.lane import URGENT_FOLLOW_UP_S, run_batch_on, run_on


def test_plain_calls_overlap():
    both = threading.Barrier(2, timeout=5)  # each call returns only once the other one runs too

    async def main():
        return await asyncio.gather(run_on("cpu", both.wait), run_on("cpu", both.wait))

    assert sorted(asyncio.run(main())) == [0, 1]


def test_an_urgent_call_runs_alone_and_before_the_calls_that_wait():
    log: list[str] = []
    release = threading.Event()

    def call(name: str, wait: threading.Event | None = None) -> None:
        log.append(f"{name}+")
        if wait is not None:
            assert wait.wait(5)
        time.sleep(0.02)
        log.append(f"{name}-")

    async def main():
        step = asyncio.ensure_future(run_on("cpu", call, "step", release))  # in progress
        await asyncio.sleep(0.05)
        first = asyncio.ensure_future(run_on("cpu", call, "first", urgent=True))  # waits for the step only
        await asyncio.sleep(0.02)
        later = asyncio.ensure_future(run_on("cpu", call, "later"))  # queued behind the urgent call
        await asyncio.sleep(0.05)
        assert log == ["step+"]  # neither started while the step runs
        release.set()
        await asyncio.gather(step, first, later)

    asyncio.run(main())
    assert log == ["step+", "step-", "first+", "first-", "later+", "later-"]


def test_gpu_calls_are_not_scheduled():
    both = threading.Barrier(2, timeout=5)

    async def main():
        return await asyncio.gather(run_on("cuda:0", both.wait, urgent=True), run_on("cuda:0", both.wait))

    assert sorted(asyncio.run(main())) == [0, 1]


def test_urgent_calls_start_in_arrival_order():
    """A stage whose urgent call ends and that asks again at once (the talker: prefill, then its first step) does
    not overtake the urgent call that was already waiting (code2wav's first packet)."""
    log: list[str] = []

    def call(name: str) -> None:
        log.append(name)
        time.sleep(0.02)

    async def talker():
        await run_on("cpu", call, "prefill", urgent=True)
        await run_on("cpu", call, "first step", urgent=True)

    async def main():
        t = asyncio.ensure_future(talker())
        await asyncio.sleep(0.005)  # the prefill runs
        await run_on("cpu", call, "first packet", urgent=True)
        await t

    asyncio.run(main())
    assert log == ["prefill", "first packet", "first step"]


def test_a_call_cancelled_while_waiting_leaves_the_queue():
    release = threading.Event()

    async def main():
        busy = asyncio.ensure_future(run_on("cpu", release.wait, 5))
        await asyncio.sleep(0.02)
        waiting = asyncio.ensure_future(run_on("cpu", time.sleep, 0, urgent=True))
        await asyncio.sleep(0.02)
        waiting.cancel()
        later = asyncio.ensure_future(run_on("cpu", lambda: "ran"))  # not held back by the cancelled urgent call
        await asyncio.sleep(0.05)
        assert later.done() and later.result() == "ran"
        release.set()
        await busy

    asyncio.run(main())


def test_a_cancelled_caller_keeps_its_turn_until_its_call_returns():
    """Cancelling the caller (an abort, a shutdown) cannot stop the thread: the next call starts once it returns,
    not beside it."""
    log: list[str] = []
    release = threading.Event()

    def call(name: str, wait: threading.Event | None = None) -> None:
        log.append(f"{name}+")
        if wait is not None:
            assert wait.wait(5)
        log.append(f"{name}-")

    async def main():
        first = asyncio.ensure_future(run_on("cpu", call, "first", release, urgent=True))
        await asyncio.sleep(0.05)
        first.cancel()
        await asyncio.sleep(0)
        second = asyncio.ensure_future(run_on("cpu", call, "second", urgent=True))
        await asyncio.sleep(0.05)
        assert first.cancelled() and log == ["first+"]  # the second waits for the thread, not the caller
        release.set()
        await second

    asyncio.run(main())
    assert log == ["first+", "first-", "second+", "second-"]


def test_a_batch_is_taken_when_its_turn_comes():
    """``run_batch_on``: what became ready while the call waited for its turn runs in it; nothing left: no call."""
    release = threading.Event()
    pending = ["a"]

    def take():
        if not pending:
            return None
        batch = list(pending)
        pending.clear()
        return (batch,)

    async def main():
        busy = asyncio.ensure_future(run_on("cpu", release.wait, 5))
        await asyncio.sleep(0.02)
        call = asyncio.ensure_future(run_batch_on("cpu", lambda items: items, take, urgent=True))
        await asyncio.sleep(0.02)
        pending.append("b")  # arrives while the call waits
        release.set()
        got = await call
        nothing = await run_batch_on("cpu", lambda items: 1 / 0, take)  # taken already: fn is not called
        await busy
        return got, nothing

    assert asyncio.run(main()) == (["a", "b"], None)


def test_urgent_work_that_follows_an_urgent_call_goes_before_the_calls_that_wait():
    """The talker's first frames end its urgent step, which asks for its next (non-urgent) step at once; code2wav's
    first piece of those frames reaches the lane a few event-loop hops later and still runs first."""
    log: list[str] = []

    def call(name: str) -> None:
        log.append(name)
        time.sleep(0.01)

    async def main():
        await run_on("cpu", call, "first step", urgent=True)
        step = asyncio.ensure_future(run_on("cpu", call, "next step"))
        for _ in range(5):  # queue -> edge -> feed -> the next stage's loop
            await asyncio.sleep(0)
        await run_on("cpu", call, "first piece", urgent=True)
        await step

    asyncio.run(main())
    assert log == ["first step", "first piece", "next step"]


def test_plain_calls_start_once_the_follow_up_time_is_over():
    """An urgent call leaves a hold of ``URGENT_FOLLOW_UP_S`` (a timer); the plain call behind it starts only once
    the hold has ended, and nothing is held after it. (How long the hold lasts: benchmarks/lane_hold.py.)"""
    from omnistage.stages.lane import _lane

    async def main():
        lane, loop = _lane(), asyncio.get_running_loop()
        before = loop.time()
        await run_on("cpu", time.sleep, 0, urgent=True)
        after, timer = loop.time(), lane.hold
        # the timer is due URGENT_FOLLOW_UP_S after the urgent call ended (a due time, not a measured duration)
        due = timer is not None and before + URGENT_FOLLOW_UP_S <= timer.when() <= after + URGENT_FOLLOW_UP_S
        seen: list[bool] = []
        await asyncio.wait_for(run_on("cpu", lambda: seen.append(lane.hold is None)), 5)  # (the deadline: a hang)
        return due, seen, lane.hold

    assert asyncio.run(main()) == (True, [True], None)


@pytest.mark.parametrize("loop_factory", ["asyncio", "uvloop"])
def test_a_plain_call_after_an_urgent_one_always_starts(loop_factory):
    """The server runs on uvloop (a cached millisecond clock) and tests on asyncio (timers run up to a clock tick
    early): however the hold's timer lands, the plain call waiting behind it starts (once this hung a server)."""

    async def main():
        for _ in range(300):
            await run_on("cpu", time.sleep, 0, urgent=True)
            await asyncio.wait_for(run_on("cpu", time.sleep, 0), 2)

    if loop_factory == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def test_an_urgent_turn_that_ran_nothing_holds_nobody_back():
    """collect() found nothing left (the requests went elsewhere meanwhile): no urgent work follows from it, so
    the plain calls are not held for URGENT_FOLLOW_UP_S."""
    from omnistage.stages.lane import _lane

    async def main():
        assert await run_batch_on("cpu", time.sleep, lambda: None, urgent=True) is None
        held_after_nothing = _lane().hold is not None
        await run_batch_on("cpu", time.sleep, lambda: (0,), urgent=True)
        return held_after_nothing, _lane().hold is not None

    assert asyncio.run(main()) == (False, True)
