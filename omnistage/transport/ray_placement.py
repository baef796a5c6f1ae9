"""Can the Ray cluster hold a stage's replicas where its ``placement`` asks, on nodes big enough for it by the
memory plan? Checked against the live nodes before an actor is created: Ray itself would leave an unplaceable
actor pending forever, and a server that hangs at start-up (or in a restart after a node is lost) says nothing
about why."""

from __future__ import annotations

import math
import re
from typing import Any

from omnistage.memory_plan import human, parse_bytes

_IN = re.compile(r"^in\((.*)\)$")
DEVICE_MEMORY_LABEL = "device_memory"  # a GPU node's label: the memory of each of its GPUs (e.g. 80GiB)


def label_matches(selector: str, value: str | None) -> bool:
    """One entry of a Ray label selector (``v``, ``!v``, ``in(a,b)``, ``!in(a,b)``) against a node's label
    (None: the node lacks it)."""
    negate = selector.startswith("!")
    body = selector[1:] if negate else selector
    m = _IN.match(body)
    allowed = {v.strip() for v in m.group(1).split(",")} if m else {body}
    return (value not in allowed) if negate else (value in allowed)


def node_capacity(node: dict[str, Any], label_selector: dict[str, str], demand: dict[str, float]) -> float:
    """How many replicas of ``demand`` the node holds in total (``inf`` when it asks for no resources), 0
    when its labels do not match or it is not alive."""
    labels = node.get("Labels") or {}
    if not node.get("Alive") or not all(label_matches(s, labels.get(k)) for k, s in label_selector.items()):
        return 0
    total = node.get("Resources") or {}
    # a small slack: fractional amounts summed by Ray come back as floats (0.1 * 10 = 0.9999...)
    return min((math.floor(total.get(k, 0.0) / n + 1e-9) for k, n in demand.items() if n > 0), default=math.inf)


def node_memory(node: dict[str, Any], gpu: bool) -> int | None:
    """The memory one device of the node has: its GPUs' (the node's ``DEVICE_MEMORY_LABEL``, e.g. ``80GiB``;
    None when it does not say) or, for a CPU stage, the node's (Ray's ``memory`` resource)."""
    if gpu:
        label = (node.get("Labels") or {}).get(DEVICE_MEMORY_LABEL)
        return parse_bytes(label) if label else None
    amount = (node.get("Resources") or {}).get("memory")
    return int(amount) if amount else None


def check_placement(
    stage: str,
    replicas: int,
    label_selector: dict[str, str],
    demand: dict[str, float],
    nodes: list[dict[str, Any]],
    need: tuple[int, str] | None = None,
) -> None:
    """Raise a RuntimeError naming the stage and what it asked for when the alive nodes cannot hold its
    ``replicas`` (resource totals, not what is free now: a busy node frees up, a missing one does not), or when
    the ones that could are too small for it: ``need`` is the bytes one device of a replica needs and why
    (memory_plan.stage_need); a node that does not say its size is taken to fit."""
    capacity = sum(node_capacity(n, label_selector, demand) for n in nodes)
    if capacity < replicas:
        asked = f"label_selector={label_selector or {}}, resources={ {k: v for k, v in demand.items() if v} }"
        seen = "; ".join(
            f"{str(n.get('NodeID', '?'))[:8]} labels={_user_labels(n)} resources={_user_resources(n)}"
            for n in nodes
            if n.get("Alive")
        )
        held = "no node" if capacity == 0 else f"the matching nodes hold only {int(capacity)} of {replicas} replicas"
        raise RuntimeError(
            f"{stage}: placement {asked} cannot be satisfied by the Ray cluster ({held}); alive nodes: {seen}"
        )
    if need is None:
        return
    gpu = demand.get("GPU", 0) > 0
    allowed = [(n, node_memory(n, gpu)) for n in nodes if node_capacity(n, label_selector, demand)]
    fits = sum(node_capacity(n, label_selector, demand) for n, size in allowed if size is None or size >= need[0])
    if fits < replicas:
        per = f"GPU (the nodes' {DEVICE_MEMORY_LABEL} label)" if gpu else "node (Ray's memory resource)"
        sizes = "; ".join(f"{str(n.get('NodeID', '?'))[:8]} {human(size)}" for n, size in allowed if size)
        raise RuntimeError(
            f"{stage}: needs {human(need[0])} per {per} by the memory plan ({need[1]}), but the nodes its "
            f"placement allows hold {int(fits)} of {replicas} replicas: {sizes}"
        )


def _user_labels(node: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}


def _user_resources(node: dict[str, Any]) -> dict[str, float]:
    # Ray adds node:<ip> and memory/object_store_memory entries: not what a placement asks for
    return {
        k: v
        for k, v in (node.get("Resources") or {}).items()
        if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }
