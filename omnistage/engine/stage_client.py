"""One stage's replicas behind a single StageEngine-shaped client.

New requests go round-robin over the healthy replicas (one that is down, e.g.
restarting after its node was lost, is skipped while another is up); every
follow-up for a request (feed, abort) goes to the replica that holds it
(affinity), and so does every request of a session (``StageRequest.session_id``:
a realtime session, a chat's ``prompt_cache_key``) while that replica is
healthy: its state (vLLM's prefix cache of the conversation, a stage's own
per-session state) is there. This is the only place that knows about replicas.
"""

from __future__ import annotations

import asyncio
import itertools
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
        self._rr = itertools.cycle(range(len(replicas)))
        self._owner: dict[str, int] = {}
        self._sessions: OrderedDict[str, int] = OrderedDict()  # session -> the replica that holds its state

    @property
    def stage_id(self) -> int:
        return self.spec.stage_id

    def _next(self) -> int:
        """The next healthy replica in turn (none healthy: the next one, which answers unavailable)."""
        first = next(self._rr)
        if len(self.replicas) == 1:
            return first
        idx = first
        for _ in range(len(self.replicas) - 1):
            if self.replicas[idx].stats().healthy:
                break
            idx = next(self._rr)
        return idx if self.replicas[idx].stats().healthy else first

    def _pick(self, session: str | None) -> int:
        """The session's replica while it is healthy (one that is down: the next healthy one takes the session
        over), else the next healthy one in turn."""
        idx = self._sessions.get(session) if session is not None else None
        if idx is None or not self.replicas[idx].stats().healthy:
            idx = self._next()
        if session is not None and len(self.replicas) > 1:
            self._sessions[session] = idx
            self._sessions.move_to_end(session)
            if len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return idx

    def end_session(self, session: str) -> None:
        """The session ended: its next request (none expected) is placed afresh."""
        self._sessions.pop(session, None)

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        idx = self._pick(req.session_id)
        self._owner[req.request_id] = idx
        try:
            async for out in self.replicas[idx].generate(req):
                yield out
        finally:
            self._owner.pop(req.request_id, None)

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        idx = self._owner.get(request_id)
        if idx is not None:
            await self.replicas[idx].feed(request_id, chunk, last)

    async def abort(self, request_id: str) -> None:
        idx = self._owner.get(request_id)
        if idx is not None:
            await self.replicas[idx].abort(request_id)

    def holds(self, request_id: str) -> bool:
        return request_id in self._owner

    def held(self) -> list[str]:
        return list(self._owner)

    async def shutdown(self) -> None:
        await asyncio.gather(*(r.shutdown() for r in self.replicas), return_exceptions=True)

    def stats(self) -> StageStats:
        parts = [r.stats() for r in self.replicas]
        return StageStats(
            queue_depth=sum(p.queue_depth for p in parts),
            running=sum(p.running for p in parts),
            healthy=all(p.healthy for p in parts),
            detail="; ".join(p.detail for p in parts if p.detail),
        )
