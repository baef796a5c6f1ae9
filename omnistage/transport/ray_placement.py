"""Can the Ray cluster hold a stage's replicas where its ``placement`` asks? Checked against the live nodes
before an actor is created: Ray itself would leave an unplaceable actor pending forever, and a server
that hangs at start-up (or in a restart after a node is lost) says nothing about why."""

from __future__ import annotations

import math
import re
from typing import Any

_IN = re.compile(r"^in\((.*)\)$")


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


def check_placement(
    stage: str, replicas: int, label_selector: dict[str, str], demand: dict[str, float], nodes: list[dict[str, Any]]
) -> None:
    """Raise a RuntimeError naming the stage and what it asked for when the alive nodes cannot hold its
    ``replicas`` (resource totals, not what is free now: a busy node frees up, a missing one does not)."""
    capacity = sum(node_capacity(n, label_selector, demand) for n in nodes)
    if capacity >= replicas:
        return
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


def _user_labels(node: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}


def _user_resources(node: dict[str, Any]) -> dict[str, float]:
    # Ray adds node:<ip> and memory/object_store_memory entries: not what a placement asks for
    return {
        k: v
        for k, v in (node.get("Resources") or {}).items()
        if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }
