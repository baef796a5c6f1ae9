"""Step-level continuous batching vs diffusers on SD3 / FLUX / Z-Image / Qwen-Image / LTX-2 / Cosmos3 (random weights).

N requests at each concurrency through omnistage (``AsyncOmni``, one diffusion stage), against
(a) the diffusers pipeline called once per request, sequentially, and
(b) diffusers called once per batch of ``concurrency`` requests (the ideal: a
    static batch of identical-shape work with no scheduling at all).

    .venv/bin/python benchmarks/diffusion_batching.py                     # tiny SD3, CPU, 1 thread
    python benchmarks/diffusion_batching.py --device cuda --preset sd3-medium --sizes 512,1024
    .venv/bin/python benchmarks/diffusion_batching.py --family flux       # or z_image, qwen_image (family_shapes.py)
    .venv/bin/python benchmarks/diffusion_batching.py --family ltx2 --sizes 32 --steps 4 --concurrency 1,4 --requests 8
    .venv/bin/python benchmarks/diffusion_batching.py --family cosmos3 --sizes 64 --steps 4 --concurrency 1,4 --requests 8

Runs go in rounds (sequential, then engine and ideal per concurrency; every other round in reverse
order, so drift hits all modes alike); the fastest run of each kind is kept and all durations are
recorded. With ``--budget-s`` a run whose estimated duration would overrun the budget is skipped
and listed as such. Writes ``<out>/<name>.{json,md}`` (default benchmarks/results/diffusion_batching).
The runs themselves and their measurements are in ``batching_runs.py``, the markdown in ``batching_report.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import family_shapes  # noqa: E402
import sd3_shapes  # noqa: E402
from batching_report import render_md, write  # noqa: E402
from batching_runs import Budget, call_kw, run_batched, run_engine, run_sequential  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PROMPTS = [
    "a red cat on a chair",
    "mountains at sunset",
    "an astronaut riding a horse",
    "a bowl of fruit",
    "city skyline at night",
    "green square and yellow circle",
    "a blue chair",
    "a watercolor painting",
]
GUIDANCE = 5.0
# Within one round: the points the targets name come first, so a short budget still measures them.
ORDER = (
    ("diffusers_sequential", 1),
    ("engine", 1),
    ("diffusers_batched_ideal", 8),
    ("engine", 8),
    ("diffusers_batched_ideal", 4),
    ("engine", 4),
    ("diffusers_batched_ideal", 16),
    ("engine", 16),
)


def quiet() -> None:
    """No loading / saving progress bars in the logs."""
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()


def engine_deploy(
    device: torch.device,
    dtype: torch.dtype,
    max_num_seqs: int,
    output_types: str | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """The one-stage deploy config the benchmark and the GPU exactness check start AsyncOmni with."""
    stage: dict[str, Any] = {"stage_id": 0, "dtype": str(dtype).removeprefix("torch."), "max_num_seqs": max_num_seqs}
    if device.type == "cuda":
        stage["devices"] = str(device.index or 0)
    if output_types:
        stage["engine_output_type"] = output_types
    if threads:
        stage["num_threads"] = threads
    return {"stages": [stage]}


def make_requests(n: int, steps: int, size: int, knobs: dict[str, Any]) -> list[dict[str, Any]]:
    """``knobs``: the family's other per-request parameters (guidance, text length), the same for every request
    (the ideal baseline is one diffusers call per batch)."""
    return [
        {
            "prompt": PROMPTS[i % len(PROMPTS)],
            "seed": i,
            "num_inference_steps": steps,
            "height": size,
            "width": size,
            **knobs,
        }
        for i in range(n)
    ]


def sd3_knobs(max_sequence_length: int) -> dict[str, Any]:
    return {"guidance_scale": GUIDANCE, "max_sequence_length": max_sequence_length}


def best(results: list[dict]) -> dict:
    out = dict(min(results, key=lambda r: r["duration_s"]))
    out["repeats"] = len(results)
    out["all_durations_s"] = [r["duration_s"] for r in results]
    out["all_rounds"] = [r["round"] for r in results]
    return out


def paired_median(eng: dict, base: dict) -> float | None:
    """Median over rounds of engine throughput / baseline throughput, each pair from the same round (same
    request count, so the inverse duration ratio): a slow stretch of a shared machine hits both sides of a
    pair, where the best-of ratio compares each side's luckiest run."""
    base_by_round = dict(zip(base["all_rounds"], base["all_durations_s"]))
    pairs = [base_by_round[r] / d for r, d in zip(eng["all_rounds"], eng["all_durations_s"]) if r in base_by_round]
    return statistics.median(pairs) if pairs else None


def ratios(runs: list[dict], concurrency: list[int]) -> dict[str, dict[str, float]]:
    by = {(r["mode"], r["concurrency"]): r for r in runs}
    seq = by.get(("diffusers_sequential", 1))
    out = {}
    for c in concurrency:
        eng = by.get(("engine", c))
        ideal = seq if c == 1 else by.get(("diffusers_batched_ideal", c))
        if eng is None or seq is None:
            continue
        r = {
            "vs_sequential": eng["throughput_rps"] / seq["throughput_rps"],
            "cpu_vs_sequential": eng["requests_per_cpu_s"] / seq["requests_per_cpu_s"],
            "latency_vs_solo": eng["latency_p50_s"] / seq["latency_p50_s"],
        }
        r["vs_sequential_paired_median"] = paired_median(eng, seq)
        if ideal is not None:
            r.update(
                vs_ideal=eng["throughput_rps"] / ideal["throughput_rps"],
                cpu_vs_ideal=eng["requests_per_cpu_s"] / ideal["requests_per_cpu_s"],
                vs_ideal_paired_median=paired_median(eng, ideal),
            )
        out[str(c)] = r
    return out


async def bench(
    args: argparse.Namespace, deadline: float | None = None, on_progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The whole benchmark in one event loop; returns the report (also written by ``main``).
    ``on_progress`` gets the report so far after every run."""
    from diffusers import StableDiffusion3Pipeline

    from omnistage import AsyncOmni

    quiet()
    device = torch.device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    budget = Budget(deadline)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    need = 5 * 2**30 if args.preset == "sd3-medium" else 2**26
    folder = sd3_shapes.work_dir(need)
    try:
        if args.family == "sd3":
            model = sd3_shapes.build(args.preset, Path(folder), device, num_layers=args.num_layers)
            pipeline_class: Any = StableDiffusion3Pipeline
        else:
            import diffusers

            model = family_shapes.build(args.family, Path(folder))
            pipeline_class = getattr(diffusers, model["pipeline_class"])
        timings["build_folder_s"] = time.perf_counter() - t
        t = time.perf_counter()
        pipe = pipeline_class.from_pretrained(folder, dtype=dtype).to(device)
        pipe.set_progress_bar_config(disable=True)
        timings["load_diffusers_s"] = time.perf_counter() - t
        t = time.perf_counter()
        omni = AsyncOmni(
            model=folder, deploy_config=engine_deploy(device, dtype, max(args.concurrency), threads=args.threads)
        )
        await omni.start()
        timings["start_engine_s"] = time.perf_counter() - t
        try:
            report = await _bench_sizes(args, pipe, omni, model, device, dtype, budget, timings, on_progress)
        finally:
            await omni.shutdown()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return report


async def _bench_sizes(
    args: argparse.Namespace,
    pipe: Any,
    omni: Any,
    model: dict,
    device: torch.device,
    dtype: torch.dtype,
    budget: Budget,
    timings: dict[str, float],
    on_progress: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    msl = model["max_sequence_length"]
    sd3 = args.family == "sd3"
    knobs = sd3_knobs(msl) if sd3 else model["knobs"]
    one_per_call = not sd3 and family_shapes.FAMILIES[args.family].one_per_call  # no batched diffusers call
    text_tokens = 77 + msl if sd3 else msl  # SD3: CLIP's 77 + T5's length; the others: at most this many
    sizes: dict[int, dict[str, Any]] = {}
    order = [(m, c) for m, c in ORDER if c in args.concurrency]
    order += [("diffusers_batched_ideal", c) for c in args.concurrency if ("engine", c) not in order and c != 1]
    order += [("engine", c) for c in args.concurrency if ("engine", c) not in order]
    for size, steps in zip(args.sizes, args.steps):
        t = time.perf_counter()
        latent_hw = size // pipe.vae_scale_factor if sd3 else None  # (the SD3 forward timing's shape)
        image_tokens = (
            (latent_hw // pipe.transformer.config.patch_size) ** 2 if sd3 else family_shapes.image_tokens(pipe, size)
        )
        reqs = make_requests(args.requests, steps, size, knobs)
        # warm-up: first kernels / cuBLAS handles at this shape, both paths, solo and the largest batch
        warm = [dict(r, num_inference_steps=2) for r in reqs[: max(args.concurrency)]]
        w = run_sequential(pipe, warm[:1], device)
        if not one_per_call:
            run_batched(pipe, warm, len(warm), device)
        await run_engine(omni, warm, len(warm), device)
        info = {
            "size": size,
            "steps": steps,
            "requests": args.requests,
            "image_tokens": image_tokens,
            "text_tokens": text_tokens,
            "warmup_s": time.perf_counter() - t,
            "warmup_solo_2step_s": w["duration_s"],
            "forward_ms_b2": (
                sd3_shapes.forward_ms(pipe.transformer, latent_hw, text_tokens, 2, device, dtype)
                if sd3
                else None
                if one_per_call
                else family_shapes.forward_ms(pipe, call_kw(reqs[0]), 2, device)
            ),
            # a pipeline of one sample per call has no batch-2 call: its lone forward instead
            "forward_ms_b1": family_shapes.forward_ms(pipe, call_kw(reqs[0]), 1, device) if one_per_call else None,
            "forward_ms_b32": (
                sd3_shapes.forward_ms(pipe.transformer, latent_hw, text_tokens, 32, device, dtype, repeats=2)
                if device.type == "cuda" and sd3
                else None
            ),
            "approx_tflop_per_row": (
                sd3_shapes.forward_tflop(pipe.transformer, image_tokens, text_tokens) if sd3 else None
            ),
        }
        sizes[size] = {"info": info, "results": {}}
    for rnd in range(args.repeats):
        for size, steps in zip(args.sizes, args.steps):
            entry = sizes[size]
            reqs = make_requests(args.requests, steps, size, knobs)
            for mode, c in order if rnd % 2 == 0 else order[::-1]:
                if mode == "diffusers_batched_ideal" and (c == 1 or one_per_call):
                    continue
                done = entry["results"]
                other = "engine" if mode == "diffusers_batched_ideal" else "diffusers_batched_ideal"
                known = done.get((mode, c)) or done.get((other, c)) or done.get(("diffusers_sequential", 1))
                # before any run at this size: the warm-up's solo 2-step call, scaled to the run
                est = (
                    min(r["duration_s"] for r in known)
                    if known
                    else entry["info"]["warmup_solo_2step_s"] / 2 * steps * args.requests
                )
                if not budget.allows(1.1 * est, {"size": size, "mode": mode, "concurrency": c, "round": rnd + 1}):
                    continue
                if mode == "diffusers_sequential":
                    res = run_sequential(pipe, reqs, device)
                elif mode == "diffusers_batched_ideal":
                    res = run_batched(pipe, reqs, c, device)
                else:
                    res = await run_engine(omni, reqs, c, device)
                res["round"] = rnd + 1
                done.setdefault((mode, c), []).append(res)
                print(
                    f"{size}px round {rnd + 1} {mode} c={c}: {res['throughput_rps']:.3f} req/s, "
                    f"p50 {res['latency_p50_s']:.3f}s ({res['duration_s']:.1f}s)",
                    flush=True,
                )
                if on_progress is not None:
                    on_progress(_report(args, device, model, timings, sizes, budget))
    return _report(args, device, model, timings, sizes, budget)


def _report(
    args: argparse.Namespace,
    device: torch.device,
    model: dict,
    timings: dict[str, float],
    sizes: dict[int, dict[str, Any]],
    budget: Budget,
) -> dict[str, Any]:
    out_sizes = []
    for entry in sizes.values():
        runs = [best(v) for (m, c), v in sorted(entry["results"].items(), key=lambda kv: (kv[0][1], kv[0][0]))]
        out_sizes.append({**entry["info"], "runs": runs, "ratios": ratios(runs, args.concurrency)})
    return {
        "config": {
            "device": str(device),
            "device_name": _device_name(device),
            "dtype": args.dtype,
            "family": args.family,
            "preset": args.preset if args.family == "sd3" else None,
            "threads": args.threads,
            "guidance_scale": GUIDANCE if args.family == "sd3" else None,
            "concurrency": args.concurrency,
            "repeats": args.repeats,
            "requests": args.requests,
            "torch": torch.__version__,
        },
        "model": model,
        "timings": timings,
        "sizes": out_sizes,
        "skipped": list(budget.skipped),
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({os.cpu_count()} cores visible)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument(
        "--family",
        default="sd3",
        choices=["sd3", *family_shapes.FAMILIES],
        help="sd3 (--preset shapes) or another image family's grown tiny fixture (family_shapes.py)",
    )
    ap.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], help="default: float32 on CPU, bfloat16 on CUDA"
    )
    ap.add_argument("--preset", choices=sorted(sd3_shapes.PRESETS), help="default: tiny on CPU, sd3-medium on CUDA")
    ap.add_argument("--num-layers", type=int, help="override the preset's transformer depth")
    ap.add_argument(
        "--sizes",
        help="comma-separated square sizes (default on CPU: 64 for sd3, 128 for the others; 512,1024 on CUDA)",
    )
    ap.add_argument("--steps", help="denoising steps, one value or one per size (default 8 on CPU, 12,8 on CUDA)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", default=None, help="comma-separated (default 1,4,8 on CPU, 1,4,8,16 on CUDA)")
    ap.add_argument("--repeats", type=int, help="rounds (default 3 on CPU, 2 on CUDA)")
    ap.add_argument("--threads", type=int, help="torch threads (default 1 on CPU)")
    ap.add_argument("--budget-s", type=float, help="skip runs that would end after this many seconds from the start")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--name", help="result file stem (default diffusion_batching, _<family> for other families)")
    args = ap.parse_args(argv)
    return finish_args(args)


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """Device-dependent defaults and list parsing (shared with gpu_check.py)."""
    gpu = args.device.startswith("cuda")
    if args.family != "sd3" and args.family not in family_shapes.available():
        raise SystemExit(
            f"--family: {args.family} has no tiny builder in this checkout "
            f"(available: sd3, {', '.join(family_shapes.available())})"
        )
    if args.name is None:
        args.name = "diffusion_batching" + ("" if args.family == "sd3" else f"_{args.family}")
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.preset = args.preset or ("sd3-medium" if gpu else "tiny")
    # CPU: the other families' VAE (x8) and 2x2 packing make 128 px 64 image tokens (SD3's tiny VAE is x2)
    cpu_size = "64" if args.family == "sd3" else "128"
    args.sizes = [int(s) for s in str(args.sizes or ("512,1024" if gpu else cpu_size)).split(",")]
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    report = asyncio.run(bench(args, deadline))
    write(report, Path(args.out), args.name)
    print(render_md(report))


if __name__ == "__main__":
    main()
