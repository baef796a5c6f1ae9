"""Aggregate metric arithmetic: percentiles, throughput, SLO attainment, stage metrics."""

import math

import pytest

from omnistage.bench.metrics import RequestResult, aggregate, parse_stage_metrics, percentile, slo_attainment
from omnistage.bench.runner import arrival_delays


def ok(rid, latency, **kw):
    return RequestResult(request_id=rid, success=True, latency=latency, **kw)


def test_percentiles_interpolate_linearly():
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 95) == pytest.approx(9.55)
    assert percentile(values, 99) == pytest.approx(9.91)
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_slo_attainment_counts_failures_as_misses():
    results = [
        ok("a", 1.0),
        ok("b", 2.5),
        ok("c", 3.5),
        RequestResult("d", success=False, latency=0.1, error="HTTP 500"),
    ]
    assert slo_attainment(results, 3.0) == pytest.approx(2 / 4)
    assert slo_attainment(results, None) is None


def test_per_request_slo_overrides_the_run_slo():
    results = [ok("a", 1.0, slo_s=0.5), ok("b", 1.0)]
    assert slo_attainment(results, 2.0) == pytest.approx(1 / 2)


def test_aggregate_core_metrics():
    results = [
        ok(str(i), float(i), peak_memory_mb=100.0 * i, stage_durations={"0": 0.1 * i, "1": 0.2 * i})
        for i in range(1, 5)
    ]
    results.append(RequestResult("x", success=False, error="boom"))
    m = aggregate(results, duration=8.0, slo_s=2.0)
    assert m["completed_requests"] == 4 and m["failed_requests"] == 1
    assert m["throughput_qps"] == pytest.approx(0.5)
    assert m["latency_mean"] == pytest.approx(2.5)
    assert m["latency_median"] == m["latency_p50"] == pytest.approx(2.5)
    assert m["latency_p99"] == pytest.approx(percentile([1, 2, 3, 4], 99))
    assert m["peak_memory_mb_max"] == 400.0 and m["peak_memory_mb_mean"] == 250.0
    assert m["stage_durations_mean"]["1"] == pytest.approx(0.5)
    assert m["stage_durations_p50"]["0"] == pytest.approx(0.25)
    assert m["slo_attainment_rate"] == pytest.approx(2 / 5)
    assert "ttft_mean_ms" not in m  # no text metrics for image runs


def test_aggregate_text_metrics_in_ms():
    results = [
        ok("a", 1.0, ttft=0.1, itl=[0.2, 0.2], tpot=0.2, output_tokens=3),
        ok("b", 2.0, ttft=0.3, itl=[0.4], tpot=0.4, output_tokens=2),
        ok("c", 1.5, ttft=0.2, itl=[], tpot=None, output_tokens=None),
    ]
    m = aggregate(results, duration=2.0)
    assert m["total_output_tokens"] == 5
    assert m["requests_without_token_count"] == 1
    assert m["ttft_mean_ms"] == pytest.approx(200.0)
    assert m["tpot_mean_ms"] == pytest.approx(300.0)
    assert m["itl_median_ms"] == pytest.approx(200.0)  # entries pooled over requests
    assert m["e2el_p50_ms"] == pytest.approx(1500.0)


def test_aggregate_audio_metrics():
    results = [ok("a", 2.0, audio_ttfp=0.5, audio_duration=4.0), ok("b", 3.0, audio_ttfp=0.7, audio_duration=3.0)]
    m = aggregate(results, duration=3.0)
    assert m["audio_rtf_mean"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["audio_ttfp_median"] == pytest.approx(0.6)
    assert m["audio_duration_max"] == pytest.approx(4.0)


def test_stage_metrics_shapes():
    durations, peak = parse_stage_metrics(
        {
            "stage_metrics": [
                {"stage_id": 0, "queue_time_s": 0.1, "run_time_s": 0.4, "peak_memory_mb": 50},
                {"stage_id": 1, "duration_s": 2.0, "peak_memory_mb": 80},
            ]
        }
    )
    assert durations == {"0": pytest.approx(0.5), "1": 2.0} and peak == 80
    durations, peak = parse_stage_metrics({"metrics": {"0": {"run_time_s": 1.0}}})
    assert durations == {"0": 1.0} and peak is None
    assert parse_stage_metrics({"data": []}) == ({}, None)


def test_arrivals_poisson_and_inf():
    assert arrival_delays(4, math.inf, 0) == [0.0] * 4
    gaps = arrival_delays(2001, 4.0, seed=1)
    assert gaps[0] == 0.0 and all(g > 0 for g in gaps[1:])
    assert sum(gaps) / 2000 == pytest.approx(0.25, rel=0.1)  # mean gap 1/rate
    assert arrival_delays(5, 2.0, seed=3) == arrival_delays(5, 2.0, seed=3)
    with pytest.raises(ValueError):
        arrival_delays(3, 0.0, 0)
