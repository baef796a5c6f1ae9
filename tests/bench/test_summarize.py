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


def test_serving_ratio_as_a_share_of_the_in_process_headroom(tmp_path):
    write(tmp_path, "t2i", "omnistage", 1, throughput_qps=3.0, latency_p99=1.0, latency_mean=0.5)
    write(tmp_path, "t2i", "naive", 1, throughput_qps=2.0, latency_p99=2.0, latency_mean=1.0)
    rounds = [{"batched_over_sequential": 1.6}, {"batched_over_sequential": 1.5}, {"batched_over_sequential": 1.8}]
    (tmp_path / "serving_t2i_headroom.json").write_text(json.dumps({"rounds": rounds, "headroom": 1.6}))
    table = load().summarize(tmp_path, ("t2i",))
    rows = {line.split("|")[2].strip(): line for line in table.splitlines() if line.startswith("| ")}
    headroom = rows["in-process headroom: diffusers batched / one by one (per round)"]
    assert "1.60, 1.50, 1.80" in headroom and "**1.60×**" in headroom
    share = rows["throughput ratio / headroom"]
    assert "**0.94**" in share and share.rstrip().endswith("| yes |")  # 1.5x served of 1.6x possible
