"""The in-process headroom of the t2i serving benchmark: how much faster diffusers itself makes the same images
as batches of the serving concurrency than one by one, on this machine, with the serving benchmark's fixture,
size, steps, guidance and threads. Step-level batching can at most reach this (in one process, without HTTP,
PNG encoding or IPC), so run_all.sh reports the serving ratio as a share of it.

    python benchmarks/t2i_headroom.py FOLDER --size 32 --steps 8 --prompts 16 --concurrency 8 --rounds 5 \\
        --threads 1 --out benchmarks/results/serving_t2i_headroom.json

Rounds alternate the order (one by one first, then batched; then the other way), so drift in machine load hits
both alike; the median of the per-round ratios is the headroom.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batching_runs import run_batched, run_sequential  # noqa: E402

PROMPT = "a photo of a cat number {i}"


def measure(args: argparse.Namespace) -> dict:
    from diffusers import StableDiffusion3Pipeline

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    pipe = StableDiffusion3Pipeline.from_pretrained(args.folder, dtype=torch.float32).to(device)
    pipe.set_progress_bar_config(disable=True)
    knobs = {"height": args.size, "width": args.size, "num_inference_steps": args.steps, "guidance_scale": args.cfg}
    reqs = [{"prompt": PROMPT.format(i=i), "seed": i, **knobs} for i in range(args.prompts)]
    run_sequential(pipe, reqs[:1], device)  # warm-up: first kernels at this shape, solo and batched
    run_batched(pipe, reqs[: args.concurrency], args.concurrency, device)
    rounds = []
    for r in range(args.rounds):
        runs = {}
        for mode in ("sequential", "batched") if r % 2 == 0 else ("batched", "sequential"):
            if mode == "sequential":
                runs[mode] = run_sequential(pipe, reqs, device)
            else:
                runs[mode] = run_batched(pipe, reqs, args.concurrency, device)
        ratio = runs["batched"]["throughput_rps"] / runs["sequential"]["throughput_rps"]
        rounds.append({"batched_over_sequential": ratio, **{m: v["throughput_rps"] for m, v in runs.items()}})
        print(f"round {r + 1}: batched / one by one = {ratio:.2f}x", flush=True)
    return {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "folder")},
        "rounds": rounds,
        "headroom": statistics.median(x["batched_over_sequential"] for x in rounds),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--cfg", type=float, default=4.0)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    report = measure(args)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"headroom (median of {args.rounds}): {report['headroom']:.2f}x")


if __name__ == "__main__":
    main()
