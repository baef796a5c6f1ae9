"""The CPU path of the real-size GPU check (``scripts/gpu_check.sh --suite evidence2 --tiny``): every part runs on
the tiny fixtures under the GPU machine's package set, so the prepared run cannot rot between the runs that
get a GPU. The real-size shapes themselves are checked on the meta device against the published model sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_path_of_every_evidence2_part(tmp_path):
    python = tmp_path / "bin" / "python-gpu-image"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tests" / "bench" / "device_image.py"}" "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_SKIP_WHEELS": "1", "PYTHON": str(python), "OUT": str(out), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--suite", "evidence2", "--tiny", "--device", "cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "gpu_evidence.json", "gpu_evidence.md"]
    doc = json.loads((out / "gpu_evidence.json").read_text())
    assert doc["errors"] == {} and doc["skipped_parts"] == []
    assert list(doc["parts"]) == ["flux", "lora", "step_cache", "qwen_image", "offload", "wan"]

    for family in ("flux", "qwen_image", "wan"):
        p = doc["parts"][family]
        # fp32 on the CPU: the engine runs diffusers' operations in diffusers' order, so not one bit differs
        assert p["exactness"]["exact"] and p["exactness"]["max_abs"] == 0.0, (family, p["exactness"])
        assert {(r["mode"], r["concurrency"]) for r in p["runs"]} == {
            ("diffusers_sequential", 1),
            ("engine", 1),
            ("diffusers_batched_ideal", 4),
            ("engine", 4),
        }, family
        for r in p["runs"]:
            assert r["throughput_rps"] > 0 and 0 < r["latency_p50_s"] <= r["latency_p99_s"] and r["peak_rss_mib"] > 0
        engine4 = next(r for r in p["runs"] if r["mode"] == "engine" and r["concurrency"] == 4)
        assert engine4["mean_running_requests"] > 1  # the 4 concurrent requests shared forwards
        assert all(v is not None for v in p["targets"].values()) and p["skipped"] == []
        assert p["request"]["num_inference_steps"] == 2 and p["model"]["tiny"]
    assert doc["parts"]["wan"]["request"]["num_frames"] == 5

    lora = doc["parts"]["lora"]
    assert lora["rank"] == 32 and lora["adapters"] == 4 and lora["skipped"] == []
    per_forward = {m: rs[0]["mean_requests_per_forward"] for m, rs in lora["runs"].items()}
    assert per_forward["mixed"] == per_forward["base"] == 8 and per_forward["grouped"] == 2  # 4 adapters x 2
    assert all(v is not None and v > 0 for v in lora["ratios"].values())

    cache = doc["parts"]["step_cache"]
    assert [(r["method"], r["threshold"]) for r in cache["rows"]] == [
        ("off", None),
        ("first_block", 0.25),
        ("first_block", 0.4),
        ("teacache", 0.1),
        ("teacache", 0.2),
    ]
    for r in cache["rows"][1:]:
        assert r["speedup_solo"] > 0 and r["speedup_c8"] > 0 and 0 <= r["c8_reused_fraction"] <= 1

    offload = doc["parts"]["offload"]["rows"]
    assert [r["offload"] for r in offload] == ["none", "model", "layer"] and all(r["time_s"] > 0 for r in offload)

    md = (out / "gpu_evidence.md").read_text()
    for heading in ("## Batching per family", "## Mixed LoRA", "## Step cache", "## Offload"):
        assert heading in md


# The model cards' nominal sizes (Qwen-Image "20B MMDiT", FLUX.1-dev "12 billion parameter", Wan2.1 "14B" and
# "1.3B"): a wrong width, head count or FFN size in real_shapes.py moves the count by more than the tolerance.
@pytest.mark.parametrize(
    "family, nominal, tol",
    [("qwen_image", 20e9, 0.03), ("flux", 12e9, 0.03), ("wan_14b", 14e9, 0.03), ("wan", 1.3e9, 0.1)],
)
def test_real_shapes_have_the_published_sizes(tmp_path, family, nominal, tol):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import real_shapes
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from omnistage.testing.tiny import build

    build(real_shapes.SHAPES[family].builder, tmp_path)
    config = json.loads((tmp_path / "transformer" / "config.json").read_text())
    model = real_shapes.real_transformer(family, config, "meta")
    params = sum(p.numel() for p in model.parameters())
    assert abs(params / nominal - 1) < tol, params
    assert all(p.dtype.is_floating_point and p.dtype.itemsize == 2 for p in model.parameters())
