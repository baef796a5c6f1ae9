"""Step-level admission policy: which requests share the next forward.

Requests are grouped by batch key (requests with different keys can never
share a forward: other latent shape, text length, components). One key runs
at a time:

- FIFO within a key; new requests of the running key join at step
  boundaries while there is room (``max_num_seqs`` latent rows).
- The engine switches key when the running key has nothing left, or when a
  request of another key has been waiting for ``max_wait_steps`` forwards
  (no starvation: the wait is bounded in forwards, whatever keeps arriving).
  Switching pauses the running requests; they resume later with nothing lost.
- The next key is the one holding the oldest request.
"""

from __future__ import annotations

from collections.abc import Hashable

from omnistage.stages.diffusion.adapter import DiffusionJob


class KeyScheduler:
    def __init__(self, max_rows: int, max_wait_steps: int):
        self.max_rows = max_rows
        self.max_wait_steps = max_wait_steps
        self.waiting: list[DiffusionJob] = []  # validated, not yet admitted (arrival order)
        self.running: list[DiffusionJob] = []  # admitted: encoded, latents ready (admission order)
        self.active: Hashable = None
        self._ticks_on_key = 0

    def add(self, job: DiffusionJob) -> None:
        self.waiting.append(job)

    def remove(self, job: DiffusionJob) -> None:
        if job in self.waiting:
            self.waiting.remove(job)
        if job in self.running:
            self.running.remove(job)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _oldest_other(self) -> DiffusionJob | None:
        others = [j for j in self.running + self.waiting if j.key != self.active]
        return min(others, key=lambda j: j.arrival) if others else None

    def next_batch(self) -> tuple[list[DiffusionJob], list[DiffusionJob]]:
        """(batch to run this step, the newly admitted part of it that still needs preparing)."""
        if not self.has_work:
            return [], []
        other = self._oldest_other()
        active_has_work = any(j.key == self.active for j in self.running + self.waiting)
        if not active_has_work or (other is not None and self._ticks_on_key >= self.max_wait_steps):
            if other is not None:
                self.active, self._ticks_on_key = other.key, 0
        self._ticks_on_key += 1
        batch = [j for j in self.running if j.key == self.active]
        rows = sum(j.rows for j in batch)
        new = []
        for j in list(self.waiting):
            if j.key != self.active:
                continue
            if batch and rows + j.rows > self.max_rows:
                break  # FIFO: a later, smaller request does not overtake
            self.waiting.remove(j)
            self.running.append(j)
            batch.append(j)
            new.append(j)
            rows += j.rows
        return batch, new
