"""Where in-process stages run their model calls: worker threads, and on the CPU a request's first output
runs alone.

A stage engine that runs a model in the server process (the step-batched AR engine, the generation
engine) hands each batched call to a worker thread so the event loop stays free. Two such stages in one
process — Qwen3-Omni's talker and code2wav — then run calls in two threads at once. That overlap is worth
having for steady streaming (one call's Python runs while the other is inside a torch op), but on the CPU it
is what made the first audio packet late under concurrency: the calls of small models are mostly Python
between torch ops, the threads share one GIL and hand it back and forth at every op, and the first packet's
decode (4 requests' first frames: 10 ms alone) took 73-135 ms beside a talker stepping the frames after it,
which are not due for a while (tiny fixture, 2 cores).

So on the CPU a call that carries some request's first output (``urgent``: a prefill, a step or decode with
a request's first token or piece) runs alone: it waits for the calls in progress (at most one each), and no
other call starts until it is done. Other calls overlap as before. On a GPU the calls queue kernels on the
device and nothing here applies (``run_on`` only schedules ``cpu``).

Two more rules, from timing each stage's first output and each call at concurrency 4: the AR engine takes its
batch when its turn comes, not when it asks (``run_batch_on``: requests whose first pieces arrived meanwhile join
this call instead of waiting a whole call for the next; the generation engine takes its batch when it asks: taking
it late gained nothing measurable), and after an urgent call the other calls wait
``URGENT_FOLLOW_UP_S`` for the urgent call it leads to (the next stage's first piece of those first outputs).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


# After an urgent call, other calls wait this long for the urgent work it leads to: its first outputs reach the
# next stage through a few event-loop hops (queue, edge, feed), and the talker's next step, asked for at once,
# would otherwise start first and hold code2wav's first piece back for a whole step (8 ms of a 62 ms first
# packet, tiny Qwen3-Omni at concurrency 4).
URGENT_FOLLOW_UP_S = 0.002


class _Lane:
    """One process's CPU model calls: they share the CPU, except urgent ones, which run alone. Waiting calls
    start in order, urgent ones first (a call that finishes and asks again at once does not jump the queue)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.running = 0  # calls in progress
        self.alone = False  # the call in progress is urgent
        self.waiting: list[tuple[bool, int, asyncio.Future]] = []  # (not urgent, arrival, granted)
        self.arrivals = 0
        self.hold: asyncio.TimerHandle | None = None  # while set, non-urgent calls wait (URGENT_FOLLOW_UP_S)

    def _dispatch(self) -> None:
        self.waiting.sort(key=lambda w: w[:2])
        while self.waiting and not self.alone:
            later, _, granted = self.waiting[0]
            if not later and self.running:  # urgent: once the calls in progress are done
                return
            if later and self.hold is not None:  # (its timer dispatches again when it ends)
                return
            self.waiting.pop(0)
            self.running += 1
            self.alone = not later
            granted.set_result(None)

    async def run(
        self, fn: Callable[..., T], args: tuple, urgent: bool, collect: Callable[[], tuple | None] | None = None
    ) -> T | None:
        granted = asyncio.get_running_loop().create_future()
        self.arrivals += 1
        self.waiting.append((not urgent, self.arrivals, granted))
        self._dispatch()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.cancelled():  # cancelled while waiting: leave the queue
                self.waiting = [w for w in self.waiting if w[2] is not granted]
                self._dispatch()
            else:  # granted, then cancelled before it ran: give the turn back
                self._release(urgent, ran=False)
            raise
        if collect is not None:
            try:
                args = collect()
            except BaseException:
                self._release(urgent, ran=False)
                raise
            if args is None:
                self._release(urgent, ran=False)
                return None
        # the turn ends when the thread does: a caller cancelled meanwhile (an abort, a shutdown) stops waiting,
        # but the call keeps the CPU until it returns, so the next one must not start beside it
        call = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        call.add_done_callback(lambda f: (f.cancelled() or f.exception(), self._release(urgent)))  # (retrieved)
        return await asyncio.shield(call)

    def _release(self, urgent: bool, ran: bool = True) -> None:
        self.running -= 1
        if urgent:
            self.alone = False
            if not ran:  # nothing ran, so no urgent work follows from it
                self._dispatch()
                return
            # a timer ends the hold, not a clock comparison: event loops run timers up to a clock tick early
            # (asyncio) or on a cached millisecond clock (uvloop), and a hold checked against the clock there
            # could outlive its last timer and leave the calls waiting for good
            if self.hold is not None:
                self.hold.cancel()
            self.hold = self.loop.call_later(URGENT_FOLLOW_UP_S, self._end_hold)
        self._dispatch()

    def _end_hold(self) -> None:
        self.hold = None
        self._dispatch()


# one lane per event loop (tests run several loops in one process; asyncio primitives belong to one loop)
_lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lane] = weakref.WeakKeyDictionary()


def stage_device(devices: list[str] | None) -> str:
    """The device a stage's models run on: its first GPU when it has one and CUDA is there, else the CPU."""
    import torch

    return f"cuda:{devices[0]}" if devices and torch.cuda.is_available() else "cpu"


def _lane() -> _Lane:
    loop = asyncio.get_running_loop()
    lane = _lanes.get(loop)
    if lane is None:
        lane = _lanes[loop] = _Lane(loop)
    return lane


async def run_on(device: str, fn: Callable[..., T], *args: Any, urgent: bool = False) -> T:
    """``fn(*args)`` in a worker thread; on the CPU an ``urgent`` call (it carries some request's first output)
    runs alone, after the calls in progress and before any that wait."""
    if not str(device).startswith("cpu"):
        return await asyncio.to_thread(fn, *args)
    return await _lane().run(fn, args, urgent)


async def run_batch_on(
    device: str, fn: Callable[..., T], collect: Callable[[], tuple | None], urgent: bool = False
) -> T | None:
    """As ``run_on``, with the batch taken when the call's turn comes: ``collect()`` runs on the event loop then
    and returns ``fn``'s arguments (None: nothing left to run, and ``fn`` is not called). On the CPU a call may
    wait for a turn for a whole call of another stage; what became ready meanwhile (the first pieces of requests
    that arrived a moment later) joins this call instead of waiting again for the next one."""
    if not str(device).startswith("cpu"):
        args = collect()
        return None if args is None else await asyncio.to_thread(fn, *args)
    return await _lane().run(fn, (), urgent, collect)
