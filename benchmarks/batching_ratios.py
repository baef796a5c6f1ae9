"""The batching benchmarks' summary of their runs: the fastest run of each kind, and engine / baseline ratios."""

from __future__ import annotations

import statistics


def best(results: list[dict]) -> dict:
    out = dict(min(results, key=lambda r: r["duration_s"]))
    out["repeats"] = len(results)
    out["all_durations_s"] = [r["duration_s"] for r in results]
    out["all_rounds"] = [r["round"] for r in results]
    return out


def paired_median(eng: dict, base: dict) -> float | None:
    """Median over rounds of engine throughput / baseline throughput, each pair from the same round (same
    request count, so the inverse duration ratio): a slow stretch of a shared machine hits both sides of a
    pair, where the best-of ratio compares each side's luckiest run."""
    base_by_round = dict(zip(base["all_rounds"], base["all_durations_s"]))
    pairs = [base_by_round[r] / d for r, d in zip(eng["all_rounds"], eng["all_durations_s"]) if r in base_by_round]
    return statistics.median(pairs) if pairs else None


def ratios(runs: list[dict], concurrency: list[int]) -> dict[str, dict[str, float]]:
    by = {(r["mode"], r["concurrency"]): r for r in runs}
    seq = by.get(("diffusers_sequential", 1))
    out = {}
    for c in concurrency:
        eng = by.get(("engine", c))
        ideal = seq if c == 1 else by.get(("diffusers_batched_ideal", c))
        if eng is None or seq is None:
            continue
        r = {
            "vs_sequential": eng["throughput_rps"] / seq["throughput_rps"],
            "cpu_vs_sequential": eng["requests_per_cpu_s"] / seq["requests_per_cpu_s"],
            "latency_vs_solo": eng["latency_p50_s"] / seq["latency_p50_s"],
        }
        r["vs_sequential_paired_median"] = paired_median(eng, seq)
        if ideal is not None:
            r.update(
                vs_ideal=eng["throughput_rps"] / ideal["throughput_rps"],
                cpu_vs_ideal=eng["requests_per_cpu_s"] / ideal["requests_per_cpu_s"],
                vs_ideal_paired_median=paired_median(eng, ideal),
            )
        out[str(c)] = r
    return out
