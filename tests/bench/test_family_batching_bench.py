"""``benchmarks/diffusion_batching.py --family`` on the CPU with tiny settings: every family it offers
builds its grown folder, runs the three modes and writes its report (the recorded results come from the
same code path with the default settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("family", ["flux", "z_image"])
def test_family_flag_runs_and_reports(family, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    args = [
        "--family",
        family,
        "--sizes",
        "32",
        "--steps",
        "2",
        "--requests",
        "4",
        "--concurrency",
        "1,4",
        "--repeats",
        "1",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "diffusion_batching.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / f"diffusion_batching_{family}.json").read_text())
    assert report["config"]["family"] == family and report["model"]["family"] == family
    # the transformer was grown past the tiny fixture's
    assert report["model"]["transformer_params"] > 1_000_000
    (size,) = report["sizes"]
    modes = {(r["mode"], r["concurrency"]) for r in size["runs"]}
    assert modes == {("diffusers_sequential", 1), ("engine", 1), ("diffusers_batched_ideal", 4), ("engine", 4)}
    engine4 = next(r for r in size["runs"] if r["mode"] == "engine" and r["concurrency"] == 4)
    assert engine4["mean_running_requests"] > 1  # the concurrent requests shared the stage
    assert set(size["ratios"]) == {"1", "4"}
    md = (tmp_path / f"diffusion_batching_{family}.md").read_text()
    assert f"({family}, CPU" in md and "## 32x32, 2 steps" in md
