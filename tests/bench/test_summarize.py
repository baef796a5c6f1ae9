"""benchmarks/summarize.py: ratios per round, median, target check."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("summarize", ROOT / "benchmarks" / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(dirpath, task, label, rnd, **metrics):
    base = {"failed_requests": 0}
    doc = {"config": {"max_concurrency": 8, "num_prompts": 24}, "metrics": {**base, **metrics}}
    (dirpath / f"serving_{task}_{label}_r{rnd}.json").write_text(json.dumps(doc))


def test_ratio_table(tmp_path):
    write(tmp_path, "t2i", "omnistage", 1, throughput_qps=4.0, latency_p99=1.0, latency_mean=0.5)
    write(tmp_path, "t2i", "naive", 1, throughput_qps=2.0, latency_p99=2.0, latency_mean=1.0)
    write(tmp_path, "t2i", "omnistage", 2, throughput_qps=3.0, latency_p99=3.0, latency_mean=1.0)
    write(tmp_path, "t2i", "naive", 2, throughput_qps=3.0, latency_p99=2.0, latency_mean=1.0)
    table = load().summarize(tmp_path)
    rows = {line.split("|")[2].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "2.00, 1.00" in rows["throughput (req/s)"] and "**1.50×**" in rows["throughput (req/s)"]
    assert rows["throughput (req/s)"].rstrip().endswith("| yes |")  # 1.5 >= 1.5
    assert "**1.00×**" in rows["p99 latency"] and "**no**" in rows["p99 latency"]  # must be strictly below
    assert "chat: no results" in table
