"""Admission of full-duplex sessions by real-time capacity: a new session is opened only while one more would keep
every live session real time (a step within ``REAL_TIME_MARGIN`` of the frame budget). The step times come from the
engine: measured for 1, 2, 4, ... sessions at start-up, then from the live steps (``MoshiEngine.step_seconds``).

Admissions run one at a time: a check and the slot it leads to are one step, so clients that connect at once are
judged one after another on the sessions admitted before them, not all on the same count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

REAL_TIME_MARGIN = 0.8  # a step may take at most 80% of a frame's period: the rest absorbs jitter


class CapacityError(Exception):
    """One more session would not stay real time; the message says the prediction and the limit."""


class DuplexAdmission:
    def __init__(self, engine: Any, budget_ms: float):
        self.engine = engine
        self.budget_ms = budget_ms
        self._lock = asyncio.Lock()

    def _stage(self) -> Any:
        return self.engine.replicas(self.engine.pipeline.stages[0].stage_id)[0]

    def refusal(self) -> str | None:
        """Why one more session would not stay real time now (None: it would, as far as is measured): the step
        time at the current session count plus one (``step_seconds``) against the budget with its margin."""
        stage = self._stage()
        held = stage.slots_held()
        predicted = stage.step_seconds(held + 1)
        limit_ms = self.budget_ms * REAL_TIME_MARGIN
        if predicted is None or predicted * 1000 <= limit_ms:
            return None
        return (
            f"real-time capacity reached: with {held + 1} sessions a step would take ~{predicted * 1000:.1f} ms, "
            f"over the limit of {limit_ms:.1f} ms ({REAL_TIME_MARGIN:.0%} of the {self.budget_ms:g} ms frame "
            "budget, --duplex-frame-budget-ms); try again later"
        )

    async def open(self, params: Mapping[str, Any]) -> Any:
        """A new duplex session, or ``CapacityError``."""
        async with self._lock:
            refusal = self.refusal()
            if refusal is not None:
                raise CapacityError(refusal)
            return await self.engine.open_duplex(params)
