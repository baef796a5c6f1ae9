"""The diffusion engine's admission window, on and off, under the serving benchmark's t2i load: two
``omnistage serve`` processes on the same tiny SD3 fixture, one with the default ``admit_window_steps`` and one
with 0, benchmarked in alternating (ABBA) rounds by ``omnistage bench serve``; the ratios on / off per round
and their median. Results: benchmarks/results/admission_window.{json,md}.

    python benchmarks/admission_window.py [--rounds 6] [--prompts 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LOAD = ["--width", "32", "--height", "32", "--num-inference-steps", "8", "--guidance-scale", "4.0"]


def deploy(work: Path, window: float | None) -> Path:
    path = work / f"window-{window}.yaml"
    extra = f"    engine_args:\n      admit_window_steps: {window}\n" if window is not None else ""
    path.write_text(f"stages:\n  - stage_id: 0\n    max_num_seqs: 8\n    num_threads: 1\n{extra}")
    return path


def bench(url: str, out: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "omnistage.cli.main", "bench", "serve", "--base-url", url, "--task", "t2i"]
    cmd += ["--num-prompts", str(args.prompts), "--max-concurrency", "8", "--request-rate", "inf", *LOAD]
    cmd += ["--warmup-requests", "2", "--seed", "0", "--disable-tqdm", "--no-plot", "--output-file", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return json.loads(out.read_text())["metrics"]


def main(argv: list[str] | None = None) -> None:
    from omnistage.testing.server import ServeProcess
    from omnistage.testing.tiny import build

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=64)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="omnistage-bench-window-"))
    model = build("sd3", work / "sd3")
    servers = {
        side: ServeProcess.launch([str(model), "--deploy-config", str(deploy(work, w))], work / f"{side}.log")
        for side, w in (("on", None), ("off", 0.0))
    }
    rounds = []
    try:
        for r in range(args.rounds):
            got = {}
            for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                got[side] = bench(servers[side].url, work / f"{side}-{r}.json", args)
            rounds.append({side: {k: got[side][k] for k in ("throughput_qps", "latency_p99")} for side in got})
            print(f"round {r + 1}: throughput on/off {got['on']['throughput_qps'] / got['off']['throughput_qps']:.2f}")
    finally:
        for s in servers.values():
            s.stop()
    thr = [x["on"]["throughput_qps"] / x["off"]["throughput_qps"] for x in rounds]
    p99 = [x["on"]["latency_p99"] / x["off"]["latency_p99"] for x in rounds]
    report = {
        "rounds": rounds,
        "throughput_on_over_off": statistics.median(thr),
        "p99_on_over_off": statistics.median(p99),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "admission_window.json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        "# Admission window on / off (tiny SD3, 32x32, 8 steps, CFG 4, concurrency 8, "
        f"{args.prompts} prompts, {args.rounds} ABBA rounds; `benchmarks/admission_window.py`)",
        "",
        "| metric | on / off per round | median |",
        "|---|---|---|",
        f"| throughput | {', '.join(f'{x:.2f}' for x in thr)} | **{report['throughput_on_over_off']:.2f}×** |",
        f"| p99 latency | {', '.join(f'{x:.2f}' for x in p99)} | **{report['p99_on_over_off']:.2f}×** |",
    ]
    (RESULTS / "admission_window.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
