"""Turn benchmarks/results/serving_*.json into the ratio table benchmarks/results/serving.md
(or, for other workloads, e.g. image_chat from benchmarks/image_chat.sh, into <name>.md).

Each workload ran in rounds (omnistage, then the baseline, alternating, both
servers up) on the same machine; the table gives omnistage / baseline per
round and the median over rounds -- ratios, not absolute seconds.

    python benchmarks/summarize.py benchmarks/results                         # t2i + chat -> serving.md
    python benchmarks/summarize.py benchmarks/results image_chat image_chat   # -> image_chat.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

# workload -> (baseline label, [(metric, label, target, higher_is_better)])
WORKLOADS = {
    "t2i": (
        "naive",
        "naive diffusers server (FastAPI + pipeline under a lock)",
        [
            ("throughput_qps", "throughput (req/s)", 1.5, True),
            ("latency_p99", "p99 latency", 1.0, False),
            ("latency_mean", "mean latency", None, False),
        ],
    ),
    "chat": (
        "vllm",
        "plain `vllm serve`",
        [
            ("throughput_qps", "throughput (req/s)", 0.95, True),
            ("output_throughput_tok_s", "output tokens/s", None, True),
            ("ttft_mean_ms", "mean TTFT", 1.10, False),
            ("ttft_p99_ms", "p99 TTFT", None, False),
            ("tpot_mean_ms", "mean TPOT", None, False),
        ],
    ),
    "image_chat": (
        "vllm",
        "plain `vllm serve`",
        [
            ("throughput_qps", "throughput (req/s)", 0.95, True),
            ("output_throughput_tok_s", "output tokens/s", None, True),
            ("ttft_mean_ms", "mean TTFT", 1.05, False),
            ("ttft_p99_ms", "p99 TTFT", None, False),
            ("tpot_mean_ms", "mean TPOT", None, False),
        ],
    ),
}
DEFAULT_TASKS = ("t2i", "chat")  # benchmarks/run_all.sh


def load_rounds(results: Path, task: str, label: str) -> dict[int, dict]:
    out = {}
    for path in sorted(results.glob(f"serving_{task}_{label}_r*.json")):
        rnd = int(path.stem.rsplit("_r", 1)[1])
        out[rnd] = json.loads(path.read_text())
    return out


def _target_text(target: float | None, higher: bool) -> str:
    if target is None:
        return "-"
    return f"≥ {target:.2f}×" if higher else (f"< {target:.2f}×" if target == 1.0 else f"≤ {target:.2f}×")


def _met(ratio: float, target: float | None, higher: bool) -> str:
    if target is None:
        return ""
    ok = ratio >= target if higher else (ratio < target if target == 1.0 else ratio <= target)
    return "yes" if ok else "**no**"


def summarize(results: Path, tasks: tuple[str, ...] = DEFAULT_TASKS) -> str:
    lines = [
        "| workload | metric | omnistage / baseline (per round) | median | target | met |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    for task in tasks:
        base_label, base_desc, metrics = WORKLOADS[task]
        omni, base = load_rounds(results, task, "omnistage"), load_rounds(results, task, base_label)
        rounds = sorted(set(omni) & set(base))
        if not rounds:
            notes.append(f"- {task}: no results (run benchmarks/run_all.sh)")
            continue
        cfg = omni[rounds[0]]["config"]
        desc = f"{task} vs {base_desc}, concurrency {cfg.get('max_concurrency')}, {cfg.get('num_prompts')} prompts"
        for rnd in rounds:
            for side, doc in (("omnistage", omni[rnd]), (base_label, base[rnd])):
                m = doc["metrics"]
                if m["failed_requests"]:
                    notes.append(f"- {task} round {rnd}: {side} had {m['failed_requests']} failed requests")
        for key, name, target, higher in metrics:
            ratios = []
            for rnd in rounds:
                a, b = omni[rnd]["metrics"].get(key), base[rnd]["metrics"].get(key)
                if a is not None and b:
                    ratios.append(a / b)
            if not ratios:
                continue
            med = statistics.median(ratios)
            per = ", ".join(f"{r:.2f}" for r in ratios)
            lines.append(
                f"| {desc} | {name} | {per} | **{med:.2f}×** | {_target_text(target, higher)} "
                f"| {_met(med, target, higher)} |"
            )
            desc = ""
            if key == "throughput_qps":
                lines += _headroom_row(results, task, med)
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _headroom_row(results: Path, task: str, serving_ratio: float) -> list[str]:
    """The serving throughput ratio as a share of what batching gains in one process on this machine
    (benchmarks/t2i_headroom.py, run by run_all.sh beside the servers): the part lost outside the batched steps."""
    path = results / f"serving_{task}_headroom.json"
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    per = ", ".join(f"{r['batched_over_sequential']:.2f}" for r in doc["rounds"])
    share = serving_ratio / doc["headroom"]
    return [
        f"|  | in-process headroom: diffusers batched / one by one (per round) | {per} | "
        f"**{doc['headroom']:.2f}×** | - |  |",
        f"|  | throughput ratio / headroom | - | **{share:.2f}** | ≥ 0.90 | {_met(share, 0.9, True)} |",
    ]


def main(argv: list[str]) -> int:
    results = Path(argv[1] if len(argv) > 1 else "benchmarks/results")
    tasks = tuple(argv[2].split(",")) if len(argv) > 2 else DEFAULT_TASKS
    name = argv[3] if len(argv) > 3 else "serving"
    header = Path(results / f"{name}_header.md")
    text = (header.read_text() if header.exists() else "") + summarize(results, tasks)
    (results / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
