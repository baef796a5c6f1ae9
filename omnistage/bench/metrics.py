"""Per-request results and the aggregate metrics the serving benchmark reports."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 95, 99)


@dataclass
class RequestResult:
    request_id: str
    success: bool = False
    latency: float = 0.0  # s, request sent -> response complete
    error: str = ""
    sent_at: float = 0.0  # s since the benchmark started
    slo_s: float | None = None  # per-request SLO override
    # text (chat)
    ttft: float | None = None
    e2e_text: float | None = None
    itl: list[float] = field(default_factory=list)
    tpot: float | None = None
    output_tokens: int | None = None
    # audio
    audio_ttfp: float | None = None  # s, request sent -> first audio bytes
    audio_duration: float | None = None  # s of audio returned
    # server-reported
    stage_durations: dict[str, float] = field(default_factory=dict)  # stage id -> s
    peak_memory_mb: float | None = None
    num_outputs: int = 0  # images / videos / audio clips returned

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def audio_rtf(self) -> float | None:
        if self.audio_duration:
            return self.latency / self.audio_duration
        return None


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        raise ValueError("percentile of no values")
    return float(np.percentile(arr, q))


def distribution(values: Iterable[float]) -> dict[str, float] | None:
    arr = [float(v) for v in values]
    if not arr:
        return None
    out = {"mean": float(np.mean(arr)), "median": float(np.median(arr))}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(arr, q)
    out["max"] = float(np.max(arr))
    return out


def slo_attainment(results: list[RequestResult], slo_s: float | None) -> float | None:
    """Share of all requests (failed ones count as misses) that finished within their SLO."""
    if not results:
        return None
    if slo_s is None and all(r.slo_s is None for r in results):
        return None
    met = 0
    for r in results:
        target = r.slo_s if r.slo_s is not None else slo_s
        if r.success and target is not None and r.latency <= target:
            met += 1
    return met / len(results)


def _flatten(out: dict[str, Any], name: str, values: Iterable[float], scale: float = 1.0, unit: str = "") -> None:
    dist = distribution(v * scale for v in values)
    if dist is None:
        return
    for stat, value in dist.items():
        out[f"{name}_{stat}{unit}"] = value


def aggregate(results: list[RequestResult], duration: float, slo_s: float | None = None) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    m: dict[str, Any] = {
        "duration": duration,
        "completed_requests": len(ok),
        "failed_requests": len(results) - len(ok),
        "throughput_qps": len(ok) / duration if duration > 0 else 0.0,
    }
    lat = distribution(r.latency for r in ok)
    for stat in ("mean", "median", "p50", "p95", "p99", "max"):
        m[f"latency_{stat}"] = lat[stat] if lat else None

    mem = [r.peak_memory_mb for r in ok if r.peak_memory_mb is not None]
    m["peak_memory_mb_max"] = max(mem) if mem else None
    m["peak_memory_mb_mean"] = float(np.mean(mem)) if mem else None
    m["peak_memory_mb_median"] = float(np.median(mem)) if mem else None

    stages = sorted({s for r in ok for s in r.stage_durations}, key=str)
    for stat in ("mean", "p50", "p99"):
        m[f"stage_durations_{stat}"] = {}
    for stage in stages:
        dist = distribution(r.stage_durations[stage] for r in ok if stage in r.stage_durations)
        for stat in ("mean", "p50", "p99"):
            m[f"stage_durations_{stat}"][stage] = dist[stat]

    m["slo_s"] = slo_s
    m["slo_attainment_rate"] = slo_attainment(results, slo_s)

    if any(r.ttft is not None for r in ok):  # text metrics, in ms like other serving benchmarks
        counted = [r for r in ok if r.output_tokens is not None]
        m["total_output_tokens"] = sum(r.output_tokens for r in counted)
        m["requests_without_token_count"] = len(ok) - len(counted)
        m["output_throughput_tok_s"] = m["total_output_tokens"] / duration if duration > 0 else 0.0
        _flatten(m, "ttft", (r.ttft for r in ok if r.ttft is not None), 1e3, "_ms")
        _flatten(m, "tpot", (r.tpot for r in ok if r.tpot is not None), 1e3, "_ms")
        _flatten(m, "itl", (x for r in ok for x in r.itl), 1e3, "_ms")
        _flatten(m, "e2el", (r.latency for r in ok), 1e3, "_ms")

    if any(r.audio_duration is not None or r.audio_ttfp is not None for r in ok):
        _flatten(m, "audio_ttfp", (r.audio_ttfp for r in ok if r.audio_ttfp is not None))
        _flatten(m, "audio_rtf", (r.audio_rtf for r in ok if r.audio_rtf is not None))
        _flatten(m, "audio_duration", (r.audio_duration for r in ok if r.audio_duration is not None))
    return m


def parse_stage_metrics(body: dict[str, Any]) -> tuple[dict[str, float], float | None]:
    """Stage durations and peak memory from a response's ``stage_metrics`` (dict keyed by
    stage id, or list of entries with ``stage_id``); accepts ``metrics`` as a fallback."""
    raw = body.get("stage_metrics")
    if raw is None and isinstance(body.get("metrics"), (dict, list)):
        raw = body["metrics"]
        if isinstance(raw, dict) and "stages" in raw:
            raw = raw["stages"]
    entries: list[tuple[str, dict]] = []
    if isinstance(raw, dict):
        entries = [(str(k), v) for k, v in raw.items() if isinstance(v, dict)]
    elif isinstance(raw, list):
        entries = [(str(e.get("stage_id", i)), e) for i, e in enumerate(raw) if isinstance(e, dict)]
    durations: dict[str, float] = {}
    peaks = []
    for stage, entry in entries:
        if isinstance(entry.get("duration_s"), (int, float)):
            durations[stage] = float(entry["duration_s"])
        elif any(isinstance(entry.get(k), (int, float)) for k in ("queue_time_s", "run_time_s")):
            durations[stage] = float(entry.get("queue_time_s") or 0) + float(entry.get("run_time_s") or 0)
        if isinstance(entry.get("peak_memory_mb"), (int, float)):
            peaks.append(float(entry["peak_memory_mb"]))
    return durations, (max(peaks) if peaks else None)
