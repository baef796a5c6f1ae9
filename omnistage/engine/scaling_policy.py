"""How many replicas a stage whose count follows the load wants (``replicas: {min, max,
target_queue_per_replica}``), from what its replicas hold now alone: no clock, no engine, so it is tested
directly. The replica scaler (replica_scaler.py) adds the time rules (when to act on it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from omnistage.config.stage_sections import ReplicaScalingConfig


@dataclass(frozen=True)
class ScalingDecision:
    replicas: int  # what the stage should have
    reason: str  # why, in words (shown on /metrics and in the log)


def decide(queues: Sequence[int], current: int, limits: ReplicaScalingConfig) -> ScalingDecision:
    """``queues``: the requests each serving replica holds (queued or running in it). The stage wants
    ``ceil(total / target_queue_per_replica)`` replicas, kept within ``min`` and ``max``."""
    total = sum(queues)
    target = limits.target_queue_per_replica
    wanted = math.ceil(total / target - 1e-9)  # 4 held at 2 per replica is 2 replicas, not 3 by rounding
    replicas = min(max(wanted, limits.min), limits.max)
    load = f"{total} request(s) in flight at {target:g} per replica"
    if replicas > current:
        held = " (capped at max)" if wanted > limits.max else ""
        return ScalingDecision(replicas, f"up: {load} want {wanted}{held}")
    if replicas < current:
        floor = " (kept at min)" if wanted < limits.min else ""
        return ScalingDecision(replicas, f"down: {load} want {wanted}{floor}")
    return ScalingDecision(replicas, f"steady: {load}")
