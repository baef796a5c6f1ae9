"""One stage's replicas behind a single StageEngine-shaped client.

New requests go round-robin; every follow-up for a request (feed, abort)
goes to the replica that holds it (affinity). This is the only place that
knows about replicas.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

from omnistage.pipeline import StageSpec
from omnistage.stages.base import StageEngine, StageOutput, StageRequest, StageStats


class StageClient:
    def __init__(self, spec: StageSpec, replicas: list[StageEngine]):
        self.spec = spec
        self.replicas = replicas
        self._rr = itertools.cycle(range(len(replicas)))
        self._owner: dict[str, int] = {}

    @property
    def stage_id(self) -> int:
        return self.spec.stage_id

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        idx = next(self._rr)
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
