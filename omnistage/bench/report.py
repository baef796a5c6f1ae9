"""Benchmark output: console table, JSON file, latency PNG, saved media."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omnistage.bench.request_funcs import Outcome

log = logging.getLogger(__name__)


def format_table(metrics: dict[str, Any]) -> str:
    lines = ["=" * 50, "Serving benchmark result".center(50), "=" * 50]
    for key, value in metrics.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) or "-"
        lines.append(f"{key:<36}{_fmt(value)}")
    lines.append("=" * 50)
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def write_json(
    path: str | Path,
    config: dict[str, Any],
    metrics: dict[str, Any],
    outcomes: list[Outcome],
    extra: dict[str, Any] | None = None,
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"config": config, "metrics": metrics, **(extra or {}), "requests": [o.result.to_json() for o in outcomes]}
    path.write_text(json.dumps(doc, indent=2, default=str))
    return path


def plot_latency(path: str | Path, outcomes: list[Outcome], title: str) -> Path | None:
    """Histogram + CDF of request latency. Needs matplotlib (``pip install omnistage[bench]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        log.warning("matplotlib is not installed; skipping the latency plot (pip install 'omnistage[bench]')")
        return None
    lat = sorted(o.result.latency for o in outcomes if o.result.success)
    if not lat:
        return None
    fig, (ax_hist, ax_cdf) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    ax_hist.hist(lat, bins=min(30, max(5, len(lat) // 2)), color="tab:blue", alpha=0.8)
    ax_hist.set_xlabel("latency (s)")
    ax_hist.set_ylabel("requests")
    ax_hist.set_title("latency distribution")
    cdf = np.arange(1, len(lat) + 1) / len(lat)
    ax_cdf.step(lat, cdf, where="post", color="tab:orange")
    for i, q in enumerate((50, 95, 99)):
        v = float(np.percentile(lat, q))
        ax_cdf.axvline(v, linestyle="--", linewidth=0.8, color="grey")
        # x in data, y in axes units; staggered because p95/p99 often coincide
        ax_cdf.text(v, 0.05 + 0.08 * i, f" p{q}", fontsize=8, transform=ax_cdf.get_xaxis_transform())
    ax_cdf.set_ylim(0, 1.05)
    ax_cdf.set_xlabel("latency (s)")
    ax_cdf.set_ylabel("fraction of requests")
    ax_cdf.set_title("latency CDF")
    if lat[0] == lat[-1]:  # one distinct value: give the axes a width to draw in
        for ax in (ax_hist, ax_cdf):
            ax.set_xlim(lat[0] * 0.9, lat[0] * 1.1 + 1e-3)
    fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def save_outputs(save_dir: str | Path, outcomes: list[Outcome]) -> int:
    """Write each request's returned media as ``<request_id>_<i>.<ext>``; returns files written."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    written = 0
    for outcome in outcomes:
        for i, (ext, data) in enumerate(outcome.outputs):
            (save_dir / f"{outcome.result.request_id}_{i}.{ext}").write_bytes(data)
            written += 1
    return written
