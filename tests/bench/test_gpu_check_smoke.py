"""scripts/gpu_check.sh on the CPU with tiny settings: the one-shot GPU check must not rot
between the runs that get a GPU. Same script, same driver, same files as on the GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_cpu_path_of_the_gpu_check(tmp_path):
    # the interpreter sees only what the GPU machine has (its image + the carried wheels): an import the
    # machine lacks fails here, not in a lent session
    python = tmp_path / "bin" / "python-gpu-image"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "bench" / "device_image.py"}" "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_SKIP_WHEELS": "1", "PYTHON": str(python), "OUT": str(out), "OMP_NUM_THREADS": "1"}
    args = [
        "--device",
        "cpu",
        "--dtypes",
        "float32",
        "--preset",
        "tiny",
        "--sizes",
        "32",
        "--steps",
        "2",
        "--requests",
        "4",
        "--concurrency",
        "1,2,4",
        "--repeats",
        "1",
    ]
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args], env=env, capture_output=True, text=True, timeout=540
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_check.json",
        "gpu_check.log",
        "gpu_check.md",
        "gpu_diffusion_batching.json",
        "gpu_diffusion_batching.md",
    ]
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["errors"] == {}

    cases = {(c["family"], c["dtype"]): c for c in doc["exactness"]["cases"]}
    assert set(cases) == {("sd3", "float32"), ("wan", "float32")}
    for case in cases.values():
        # fp32 on the CPU: the engine runs diffusers' operations in diffusers' order, so not one bit differs
        assert case["solo_latent"]["max_abs"] == 0.0 and case["solo_latent"]["exact"], case
        assert case["solo_decoded"]["max_level_diff"] == 0, case
        assert case["batched_vs_solo"]["max_running_seen"] == 3 and case["batched_vs_solo"]["ok"], case
    assert doc["exactness"]["ok"]

    bench = json.loads((out / "gpu_diffusion_batching.json").read_text())
    assert bench == doc["bench"]
    [size] = bench["sizes"]
    assert size["size"] == 32 and size["steps"] == 2 and bench["skipped"] == []
    modes = {(r["mode"], r["concurrency"]) for r in size["runs"]}
    assert modes == {
        ("diffusers_sequential", 1),
        ("engine", 1),
        ("diffusers_batched_ideal", 2),
        ("engine", 2),
        ("diffusers_batched_ideal", 4),
        ("engine", 4),
    }
    for r in size["runs"]:
        assert r["throughput_rps"] > 0 and 0 < r["latency_p50_s"] <= r["latency_p99_s"] and r["peak_rss_mib"] > 0
    engine4 = next(r for r in size["runs"] if r["mode"] == "engine" and r["concurrency"] == 4)
    assert engine4["mean_running_requests"] > 1  # the 4 concurrent requests shared forwards
    assert set(size["ratios"]) == {"1", "2", "4"}
    assert set(doc["targets"]["32"]) == {"engine_vs_ideal_c8", "engine_vs_sequential_c8", "solo_latency_vs_diffusers"}
    md = (out / "gpu_check.md").read_text()
    assert "| sd3 | float32 | 0 | 0 | True | 0 |" in md and "## 32x32, 2 steps" in md


def test_budget_skips_what_does_not_fit_and_says_so():
    db = _load("diffusion_batching")
    budget = db.Budget(time.monotonic() + 5.0)
    assert budget.allows(1.0, {"mode": "engine", "concurrency": 1})
    assert not budget.allows(60.0, {"mode": "engine", "concurrency": 8})
    assert [s["concurrency"] for s in budget.skipped] == [8] and budget.skipped[0]["estimate_s"] == 60.0
    assert db.Budget(None).allows(1e9, {})


def test_targets_are_read_off_the_512_table():
    gc = _load("gpu_check")
    report = {
        "sizes": [
            {"size": 512, "ratios": {"1": {"latency_vs_solo": 1.04}, "8": {"vs_ideal": 0.95, "vs_sequential": 1.9}}},
            {"size": 1024, "ratios": {"1": {"latency_vs_solo": 1.2}}},
        ]
    }
    t = gc.check_targets(report)
    assert t["512"]["meets"] == {"vs_ideal>=0.9": True, "vs_sequential>=2": False, "solo_latency<=1.05": True}
    assert t["1024"] == {"engine_vs_ideal_c8": None, "engine_vs_sequential_c8": None, "solo_latency_vs_diffusers": 1.2}


def test_the_image_filter_hides_what_the_gpu_machine_lacks(tmp_path):
    """The filter the smoke test runs under is itself checked: vLLM (installed here, absent there) is hidden,
    the image's and the carried packages are not."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib.util as u\nprint([u.find_spec(m) is not None for m in "
        "('vllm', 'fastapi', 'torch', 'transformers', 'diffusers', 'pydantic', 'msgspec')])\n"
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bench" / "device_image.py"), str(probe)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip() == "[False, False, True, True, True, True, True]", proc.stderr[-2000:]
