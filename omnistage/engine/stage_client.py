"""One stage's replicas behind a single StageEngine-shaped client.

New requests go round-robin over the healthy replicas (one that is down, e.g.
restarting after its node was lost, is skipped while another is up); every
follow-up for a request (feed, abort) goes to the replica that holds it
(affinity), and so does every request of a session (``StageRequest.session_id``:
a realtime session, a chat's ``prompt_cache_key``) while that replica is
healthy: its state (vLLM's prefix cache of the conversation, a stage's own
per-session state) is there. This is the only place that knows about replicas. A
stage whose replica count follows the load (replica_scaler.py) adds replicas here
and drains them: a draining replica takes nothing new and is removed once the
requests it holds have ended.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from omnistage.pipeline import StageSpec
from omnistage.stages.base import StageEngine, StageOutput, StageRequest, StageStats

MAX_SESSIONS = 10_000  # sessions remembered per stage; the least recently used is forgotten first


class StageClient:
    def __init__(self, spec: StageSpec, replicas: list[StageEngine]):
        self.spec = spec
        self.replicas = replicas
        self.draining: list[StageEngine] = []  # finishing what they hold, taking nothing new, then removed
        self.scaler: Any = None  # a ReplicaScaler when the stage's replica count follows the load
        self._turn = 0
        self._owner: dict[str, StageEngine] = {}  # request -> the replica that holds it
        self._sessions: OrderedDict[str, StageEngine] = OrderedDict()  # session -> the replica that holds its state
        self._released = asyncio.Event()  # a request ended (a draining replica may be empty now)

    @property
    def stage_id(self) -> int:
        return self.spec.stage_id

    def serving(self) -> list[StageEngine]:
        """The replicas that take new requests (all but the draining ones)."""
        return [r for r in self.replicas if r not in self.draining]

    def _next(self) -> StageEngine:
        """The next healthy serving replica in turn (none healthy: the next one, which answers unavailable)."""
        serving = self.serving()
        first = self._turn % len(serving)
        self._turn += 1
        for step in range(len(serving)):
            replica = serving[(first + step) % len(serving)]
            if replica.stats().healthy:
                return replica
        return serving[first]

    def _pick(self, session: str | None) -> StageEngine:
        """The session's replica while it is healthy and serving (one that is down or draining: the next
        healthy one takes the session over), else the next healthy one in turn."""
        replica = self._sessions.get(session) if session is not None else None
        if replica is None or replica in self.draining or not replica.stats().healthy:
            replica = self._next()
        if session is not None and len(self.replicas) > 1:
            self._sessions[session] = replica
            self._sessions.move_to_end(session)
            if len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return replica

    def loads(self) -> list[int]:
        """The requests each serving replica holds now, in replica order."""
        held = [0] * len(self.replicas)
        position = {id(r): i for i, r in enumerate(self.replicas)}
        for replica in self._owner.values():
            held[position[id(replica)]] += 1
        return [n for r, n in zip(self.replicas, held) if r not in self.draining]

    def holding(self, replica: StageEngine) -> int:
        return sum(1 for r in self._owner.values() if r is replica)

    def add(self, replica: StageEngine) -> None:
        """A started replica joins: it takes new requests from now on."""
        self.replicas.append(replica)

    async def drain(self, replica: StageEngine) -> None:
        """Take no new request to ``replica`` (its sessions move to the others at their next turn), wait until
        the requests it holds have ended, then remove it and shut it down."""
        self.stop_routing_to(replica)
        await self.remove_when_done(replica)

    def stop_routing_to(self, replica: StageEngine) -> None:
        """The first half of ``drain``: from now on ``replica`` takes no new request."""
        if len(self.serving()) <= 1 or replica in self.draining:
            raise ValueError(f"stage {self.stage_id}: cannot drain its last serving replica")
        self.draining.append(replica)

    async def remove_when_done(self, replica: StageEngine) -> None:
        """The second half of ``drain``: once the requests ``replica`` holds have ended, remove it and shut it
        down."""
        try:
            while self.holding(replica):
                self._released.clear()
                await self._released.wait()
        except BaseException:  # stopped mid-drain (the stage shuts down): it stays, and is shut down with the rest
            self.draining.remove(replica)
            raise
        self.replicas.remove(replica)
        self.draining.remove(replica)
        for session in [s for s, r in self._sessions.items() if r is replica]:
            del self._sessions[session]
        await replica.shutdown()

    def end_session(self, session: str) -> None:
        """The session ended: its next request (none expected) is placed afresh."""
        self._sessions.pop(session, None)

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        replica = self._pick(req.session_id)
        self._owner[req.request_id] = replica
        try:
            async for out in replica.generate(req):
                yield out
        finally:
            self._owner.pop(req.request_id, None)
            self._released.set()

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        replica = self._owner.get(request_id)
        if replica is not None:
            await replica.feed(request_id, chunk, last)

    async def abort(self, request_id: str) -> None:
        replica = self._owner.get(request_id)
        if replica is not None:
            await replica.abort(request_id)

    def holds(self, request_id: str) -> bool:
        return request_id in self._owner

    def held(self) -> list[str]:
        return list(self._owner)

    async def shutdown(self) -> None:
        if self.scaler is not None:  # first: it may be starting or draining replicas
            await self.scaler.stop()
        await asyncio.gather(*(r.shutdown() for r in self.replicas), return_exceptions=True)

    def stats(self) -> StageStats:
        parts = [r.stats() for r in self.replicas]
        return StageStats(
            queue_depth=sum(p.queue_depth for p in parts),
            running=sum(p.running for p in parts),
            healthy=all(p.healthy for p in parts),
            detail="; ".join(p.detail for p in parts if p.detail),
            replicas=len(self.replicas) - len(self.draining),
            scaled=self.scaler.last_reason if self.scaler is not None else "",
        )
