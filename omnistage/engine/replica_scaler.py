"""A stage whose replica count follows the load (``replicas: {min, max, target_queue_per_replica}``, Ray
stages: docs/distributed.md).

Every ``interval_s`` the scaler asks the policy (scaling_policy.py) how many replicas the requests the stage's
replicas hold call for. More: it starts them at once (each a new replica through the stage's own factory: a
Ray actor placed like the others) and they take new requests once started. Fewer: only once the policy has
asked for fewer for ``scale_down_delay_s`` without a break, and never while a start is under way; it drains
the replica holding the fewest requests (the newest of equals): that replica takes nothing new, finishes what
it holds, and is then removed and shut down (StageClient.drain). ``last_reason`` says why it last changed
(``/metrics``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from omnistage.config.stage_sections import ReplicaScalingConfig
from omnistage.engine.scaling_policy import decide
from omnistage.engine.stage_client import StageClient
from omnistage.stages.base import StageEngine

logger = logging.getLogger(__name__)

SCALE_INTERVAL_S = 0.5  # how often the load is looked at (a look is a few counters: no engine is asked)


class ReplicaScaler:
    def __init__(
        self,
        client: StageClient,
        start_replica: Callable[[int], Awaitable[StageEngine]],
        limits: ReplicaScalingConfig,
        interval_s: float = SCALE_INTERVAL_S,
    ):
        """``start_replica(index)``: a started replica of the stage (shut down again if its start fails)."""
        self.client, self.limits, self.interval_s = client, limits, interval_s
        self._start_replica = start_replica
        self._next_index = len(client.replicas)  # replica numbers are never reused (logs, actor names)
        self.last_reason = f"started with min={limits.min} replica(s)"
        self._below_since: float | None = None
        self._starting: asyncio.Task | None = None
        self._drains: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"scaler-stage{self.client.stage_id}")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._starting, *self._drains) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.step(time.monotonic())
            except Exception:  # a bug here must not stop later scaling of the stage
                logger.exception("stage %d: replica scaling failed", self.client.stage_id)

    def step(self, now: float) -> None:
        """Look at the load once, and start a change it calls for."""
        if self._starting is not None and not self._starting.done():
            return  # what is starting is not serving yet: the load seen now does not count it
        serving = len(self.client.serving())
        decision = decide(self.client.loads(), serving, self.limits)
        if decision.replicas > serving:
            self._below_since = None
            self._starting = asyncio.create_task(self._add(decision.replicas - serving, decision.reason))
        elif decision.replicas < serving:
            self._below_since = now if self._below_since is None else self._below_since
            if now - self._below_since >= self.limits.scale_down_delay_s:
                self._below_since = None
                self._remove(serving - decision.replicas, decision.reason)
        else:
            self._below_since = None

    def _record(self, reason: str) -> None:
        self.last_reason = reason
        logger.info("stage %d: %s", self.client.stage_id, reason)

    async def _add(self, count: int, reason: str) -> None:
        indices = list(range(self._next_index, self._next_index + count))
        self._next_index += count
        started = await asyncio.gather(*(self._start_replica(i) for i in indices), return_exceptions=True)
        failures = [e for e in started if isinstance(e, BaseException)]
        for engine in started:
            if not isinstance(engine, BaseException):
                self.client.add(engine)
        serving = len(self.client.serving())
        if failures:
            self._record(f"{reason}; {count - len(failures)} of {count} started ({failures[0]}); now {serving}")
        else:
            self._record(f"{reason}; now {serving}")

    def _remove(self, count: int, reason: str) -> None:
        serving = self.client.serving()
        # the replica with the fewest requests to finish first; of equals the newest
        order = sorted(range(len(serving)), key=lambda i: (self.client.holding(serving[i]), -i))
        victims = [serving[i] for i in order[:count]]
        held = sum(self.client.holding(r) for r in victims)
        for replica in victims:
            self.client.stop_routing_to(replica)
            task = asyncio.create_task(self._drain(replica))
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
        self._record(
            f"{reason}; draining {count} (holding {held} request(s) to finish), now {len(self.client.serving())}"
        )

    async def _drain(self, replica: StageEngine) -> None:
        try:
            await self.client.remove_when_done(replica)
        except Exception:
            logger.exception("stage %d: draining a replica failed", self.client.stage_id)
