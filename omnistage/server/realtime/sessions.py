"""The server's realtime sessions: how many may be open at once (``--max-realtime-sessions``) and their
Prometheus counters (on the server's own registry, so /metrics shows them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RealtimeSessions:
    def __init__(self, limit: int | None, registry: CollectorRegistry):
        self.limit = limit
        self.open = 0
        self.opened = Counter("omnistage_realtime_sessions", "realtime sessions opened", registry=registry)
        self.refused = Counter(
            "omnistage_realtime_sessions_refused", "realtime sessions refused", ["reason"], registry=registry
        )
        self.active = Gauge("omnistage_realtime_sessions_active", "realtime sessions open now", registry=registry)
        self.events = Counter(
            "omnistage_realtime_events",
            "realtime events by direction and type",
            ["direction", "type"],
            registry=registry,
        )
        self.errors = Counter("omnistage_realtime_errors", "error events sent, by code", ["code"], registry=registry)

    def try_open(self) -> bool:
        if self.limit is not None and self.open >= self.limit:
            self.refused.labels("max_sessions").inc()
            return False
        self.open += 1
        self.opened.inc()
        self.active.set(self.open)
        return True

    def close(self) -> None:
        self.open -= 1
        self.active.set(self.open)
