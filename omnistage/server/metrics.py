"""Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _StageCollector:
    """Per-stage queue depth, running batch size, health and replicas, read at scrape time."""

    def __init__(self, stats: Callable[[], dict[int, Any]]):
        self._stats = stats

    def collect(self):
        depth = GaugeMetricFamily("omnistage_stage_queue_depth", "requests waiting in a stage", labels=["stage"])
        running = GaugeMetricFamily("omnistage_stage_running", "requests in a stage's current batch", labels=["stage"])
        healthy = GaugeMetricFamily("omnistage_stage_healthy", "1 when the stage is healthy", labels=["stage"])
        replicas = GaugeMetricFamily("omnistage_stage_replicas", "replicas taking requests", labels=["stage"])
        scaled = GaugeMetricFamily(
            "omnistage_stage_last_scaling", "why the stage's replica count last changed (1)", labels=["stage", "reason"]
        )
        for sid, s in sorted(self._stats().items()):
            depth.add_metric([str(sid)], s.queue_depth)
            running.add_metric([str(sid)], s.running)
            healthy.add_metric([str(sid)], 1.0 if s.healthy else 0.0)
            replicas.add_metric([str(sid)], s.replicas)
            if s.scaled:  # only stages whose replica count follows the load
                scaled.add_metric([str(sid), s.scaled], 1.0)
        yield from (depth, running, healthy, replicas, scaled)


class ServerMetrics:
    def __init__(self, stage_stats: Callable[[], dict[int, Any]]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "omnistage_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "omnistage_request_latency_seconds",
            "end-to-end request latency",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "omnistage_time_to_first_output_seconds",
            "time to the first streamed output",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_latency = Histogram(
            "omnistage_stage_run_seconds",
            "per-request run time in a stage",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "omnistage_requests_in_flight", "generation requests admitted and not finished", registry=r
        )
        self.rejected = Counter(
            "omnistage_requests_rejected", "requests refused because the server was saturated", registry=r
        )
        self.aborted = Counter(
            "omnistage_requests_aborted", "requests aborted (client disconnect or delete)", registry=r
        )
        self.failed = Counter("omnistage_requests_failed", "requests that failed in a stage", registry=r)
        self.prompt_tokens = Counter("omnistage_prompt_tokens", "prompt tokens processed", registry=r)
        self.generation_tokens = Counter("omnistage_generation_tokens", "tokens generated", registry=r)
        self.images = Counter("omnistage_images_generated", "images returned", registry=r)
        self.audio_seconds = Counter("omnistage_audio_generated_seconds", "seconds of audio returned", registry=r)
        self.videos = Counter("omnistage_videos_generated", "videos produced", registry=r)
        r.register(_StageCollector(stage_stats))
