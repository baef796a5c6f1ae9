"""KeyScheduler (stages/diffusion/batching.py), the diffusion engine's admission policy, on jobs built
directly: FIFO within a key, bounded wait across keys, the row cap, removal."""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import pytest

from omnistage.params import DiffusionSamplingParams
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.batching import KeyScheduler


class Jobs:
    """Jobs with a strictly increasing arrival time, in the order the test makes them."""

    def __init__(self) -> None:
        self._clock = itertools.count(1)

    def __call__(self, rid: str, key: Hashable = "a", rows: int = 1) -> DiffusionJob:
        return DiffusionJob(
            rid, "p", None, DiffusionSamplingParams(), arrival=float(next(self._clock)), key=key, rows=rows
        )


@pytest.fixture
def job() -> Jobs:
    return Jobs()


def ids(jobs: list[DiffusionJob]) -> list[str]:
    return [j.request_id for j in jobs]


def drain(sched: KeyScheduler, steps: dict[str, int]) -> list[list[str]]:
    """Every forward until no work is left (bounded: a scheduler that never empties fails, not hangs)."""
    batches = []
    while sched.has_work:
        assert len(batches) < 1000, "the scheduler never ran out of work"
        batches.append(forward(sched, steps))
    return batches


def forward(sched: KeyScheduler, steps: dict[str, int]) -> list[str]:
    """One engine step: the batch's ids; each job in it does a step, and leaves when its ``steps`` are done."""
    batch, _ = sched.next_batch()
    for j in batch:
        steps[j.request_id] -= 1
        if steps[j.request_id] == 0:
            sched.remove(j)
    return ids(batch)


def test_nothing_to_do():
    sched = KeyScheduler(max_rows=4, max_wait_steps=3)
    assert not sched.has_work and sched.next_batch() == ([], [])


def test_fifo_within_a_key(job):
    sched = KeyScheduler(max_rows=2, max_wait_steps=100)
    for rid in ("r0", "r1", "r2", "r3"):
        sched.add(job(rid))
    batch, new = sched.next_batch()
    assert ids(batch) == ["r0", "r1"] and ids(new) == ["r0", "r1"]  # arrival order, up to the cap
    batch, new = sched.next_batch()
    assert ids(batch) == ["r0", "r1"] and new == []  # running jobs stay; nothing new fits
    sched.remove(batch[0])
    batch, new = sched.next_batch()
    assert ids(batch) == ["r1", "r2"] and ids(new) == ["r2"]  # the freed row goes to the oldest waiting job
    assert ids(sched.waiting) == ["r3"]


def test_the_key_of_the_oldest_request_runs_first(job):
    sched = KeyScheduler(max_rows=8, max_wait_steps=100)
    sched.add(job("b0", key="b"))
    sched.add(job("a0", key="a"))
    sched.add(job("b1", key="b"))
    batch, new = sched.next_batch()
    assert ids(batch) == ["b0", "b1"] and ids(new) == ["b0", "b1"]  # both b jobs share the forward, a waits
    assert sched.active == "b" and ids(sched.waiting) == ["a0"]


def test_keys_never_share_a_forward(job):
    sched = KeyScheduler(max_rows=8, max_wait_steps=2)
    steps = {}
    for i in range(3):
        for key in ("a", "b", "c"):
            sched.add(job(f"{key}{i}", key=key))
            steps[f"{key}{i}"] = 4
    for batch in drain(sched, steps):
        assert len({rid[0] for rid in batch}) == 1, batch
    assert all(n == 0 for n in steps.values())  # and every job ran all its steps


@pytest.mark.parametrize("max_wait", [1, 3, 5])
def test_other_key_is_served_within_max_wait_steps_whatever_keeps_arriving(job, max_wait):
    sched = KeyScheduler(max_rows=64, max_wait_steps=max_wait)
    steps = {"a0": 1000}
    sched.add(job("a0", key="a"))
    assert forward(sched, steps) == ["a0"]
    sched.add(job("b0", key="b"))
    steps["b0"] = 2
    waited = 0
    while True:  # a new request of the running key arrives before every forward
        rid = f"a{waited + 1}"
        sched.add(job(rid, key="a"))
        steps[rid] = 1000
        batch = forward(sched, steps)
        if "b0" in batch:
            break
        waited += 1
        assert waited <= max_wait, f"b0 still waiting after {waited} forwards of key a"
    assert batch == ["b0"]  # alone: keys never share a forward
    # the wait counts the running key's forwards since it got its turn: a0 had run one when b0 arrived
    assert waited == max_wait - 1
    # and key a, whose requests now wait, gets its turn back within the same bound
    assert any("a0" in forward(sched, steps) for _ in range(max_wait))


def test_the_switched_away_key_resumes_where_it_was(job):
    sched = KeyScheduler(max_rows=8, max_wait_steps=2)
    steps = {"a0": 5, "b0": 3}
    sched.add(job("a0", key="a"))
    sched.add(job("b0", key="b"))
    order = [rid for batch in drain(sched, steps) for rid in batch]
    # two forwards per key in turn, until one key has nothing left; no step is lost or repeated
    assert order == ["a0", "a0", "b0", "b0", "a0", "a0", "b0", "a0"]


def test_row_cap_counts_rows_not_requests(job):
    sched = KeyScheduler(max_rows=4, max_wait_steps=100)
    sched.add(job("r0", rows=3))
    sched.add(job("r1", rows=2))  # does not fit beside r0 (5 > 4 rows)
    sched.add(job("r2", rows=1))  # would fit, but may not overtake r1
    batch, _ = sched.next_batch()
    assert ids(batch) == ["r0"] and ids(sched.waiting) == ["r1", "r2"]
    assert ids(sched.next_batch()[0]) == ["r0"]  # still not: FIFO holds while r0 runs
    sched.remove(batch[0])
    batch, new = sched.next_batch()
    assert ids(batch) == ["r1", "r2"] and ids(new) == ["r1", "r2"] and sum(j.rows for j in batch) == 3


def test_a_request_larger_than_the_cap_runs_alone(job):
    sched = KeyScheduler(max_rows=2, max_wait_steps=100)
    sched.add(job("big", rows=5))
    sched.add(job("small"))
    batch, _ = sched.next_batch()
    assert ids(batch) == ["big"]  # admitted into an empty batch rather than starved
    sched.remove(batch[0])
    assert ids(sched.next_batch()[0]) == ["small"]


def test_removing_a_waiting_job_means_it_never_runs(job):
    sched = KeyScheduler(max_rows=1, max_wait_steps=100)
    first, second, third = job("r0"), job("r1"), job("r2")
    for j in (first, second, third):
        sched.add(j)
    assert ids(sched.next_batch()[0]) == ["r0"]
    sched.remove(second)
    sched.remove(first)
    assert ids(sched.next_batch()[0]) == ["r2"]
    sched.remove(third)
    assert not sched.has_work and sched.next_batch() == ([], [])


def test_removing_a_running_job_frees_its_rows_and_its_key(job):
    sched = KeyScheduler(max_rows=2, max_wait_steps=100)
    a0, a1 = job("a0", key="a", rows=2), job("a1", key="a", rows=2)
    b0 = job("b0", key="b")
    for j in (a0, b0, a1):
        sched.add(j)
    assert ids(sched.next_batch()[0]) == ["a0"]
    sched.remove(a0)  # aborted mid-run
    assert a0 not in sched.running and a0 not in sched.waiting
    # key a's running job is gone but a1 waits: the key keeps its turn and a1 takes the freed rows
    batch, new = sched.next_batch()
    assert ids(batch) == ["a1"] and ids(new) == ["a1"]
    sched.remove(a1)
    assert ids(sched.next_batch()[0]) == ["b0"]  # nothing left of key a: the next key runs at once
    sched.remove(job("never-added"))  # removing an unknown job is a no-op
    assert ids(sched.running) == ["b0"]
