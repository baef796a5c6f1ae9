"""diffusion_batching.py's command line: its flags, and the defaults that depend on the device and the workload
(``finish_args``, shared with gpu_check.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import family_shapes
import sd3_shapes
from batching_workloads import GrownWorkload, PresetWorkload, families, workload_class


def parser(description: str, results: Path) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument(
        "--family",
        default=sd3_shapes.FAMILY,
        choices=families(),
        help=f"{sd3_shapes.FAMILY} (--preset shapes) or another image family's grown tiny fixture (family_shapes.py)",
    )
    ap.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], help="default: float32 on CPU, bfloat16 on CUDA"
    )
    ap.add_argument("--preset", choices=sorted(sd3_shapes.PRESETS), help="default: tiny on CPU, sd3-medium on CUDA")
    ap.add_argument("--num-layers", type=int, help="override the preset's transformer depth")
    ap.add_argument(
        "--sizes",
        help=f"comma-separated square sizes (default on CPU: {PresetWorkload.cpu_size} for the --preset shapes, "
        f"{GrownWorkload.cpu_size} for the others; 512,1024 on CUDA)",
    )
    ap.add_argument("--steps", help="denoising steps, one value or one per size (default 8 on CPU, 12,8 on CUDA)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", default=None, help="comma-separated (default 1,4,8 on CPU, 1,4,8,16 on CUDA)")
    ap.add_argument("--repeats", type=int, help="rounds (default 3 on CPU, 2 on CUDA)")
    ap.add_argument("--threads", type=int, help="torch threads (default 1 on CPU)")
    ap.add_argument("--budget-s", type=float, help="skip runs that would end after this many seconds from the start")
    ap.add_argument("--out", default=str(results))
    ap.add_argument("--name", help="result file stem (default diffusion_batching, _<family> for other families)")
    return ap


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """Device-dependent defaults and list parsing (shared with gpu_check.py)."""
    gpu = args.device.startswith("cuda")
    work = workload_class(args.family)
    if work is not PresetWorkload and args.family not in family_shapes.available():
        raise SystemExit(
            f"--family: {args.family} has no tiny builder in this checkout "
            f"(available: {', '.join([families()[0], *family_shapes.available()])})"
        )
    if args.name is None:  # the preset workload's results keep the unsuffixed name
        args.name = "diffusion_batching" + ("" if work is PresetWorkload else f"_{args.family}")
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.preset = args.preset or ("sd3-medium" if gpu else "tiny")
    args.sizes = [int(s) for s in str(args.sizes or ("512,1024" if gpu else work.cpu_size)).split(",")]
    steps = [int(s) for s in str(args.steps or ("12,8" if gpu else "8")).split(",")]
    if len(steps) not in (1, len(args.sizes)):
        raise SystemExit(f"--steps: give one value or one per size ({len(args.sizes)}), got {len(steps)}")
    args.steps = steps * len(args.sizes) if len(steps) == 1 else steps
    args.concurrency = [int(c) for c in str(args.concurrency or ("1,4,8,16" if gpu else "1,4,8")).split(",")]
    if 1 not in args.concurrency:
        raise SystemExit("--concurrency: must include 1 (the solo latency and the sequential baseline)")
    if args.requests < max(args.concurrency):
        raise SystemExit(f"--requests: {args.requests} is below the largest concurrency {max(args.concurrency)}")
    args.repeats = args.repeats or (2 if gpu else 3)
    args.threads = args.threads or (None if gpu else 1)
    return args
