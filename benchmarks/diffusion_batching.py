"""Step-level continuous batching vs diffusers on SD3 / FLUX / Z-Image / Qwen-Image / LTX-2 / Cosmos3 (random weights).

N requests at each concurrency through omnistage (``AsyncOmni``, the family's diffusion stage(s)), against
(a) the diffusers pipeline called once per request, sequentially, and
(b) diffusers called once per batch of ``concurrency`` requests (the ideal: a
    static batch of identical-shape work with no scheduling at all).

    .venv/bin/python benchmarks/diffusion_batching.py                     # tiny SD3, CPU, 1 thread
    python benchmarks/diffusion_batching.py --device cuda --preset sd3-medium --sizes 512,1024
    .venv/bin/python benchmarks/diffusion_batching.py --family flux       # or z_image, qwen_image (family_shapes.py)
    .venv/bin/python benchmarks/diffusion_batching.py --family ltx2 --sizes 32 --steps 4 --concurrency 1,4 --requests 8
    .venv/bin/python benchmarks/diffusion_batching.py --family cosmos3 --sizes 64 --steps 4 --concurrency 1,4 --requests 8
    .venv/bin/python benchmarks/diffusion_batching.py --family qwen_image_layered --sizes 64   # an image in, 2 layers out
    .venv/bin/python benchmarks/diffusion_batching.py --family ltx2_two_stage --sizes 64 --steps 4  # two stages

Runs go in rounds (sequential, then engine and ideal per concurrency; every other round in reverse
order, so drift hits all modes alike); the fastest run of each kind is kept and all durations are
recorded. With ``--budget-s`` a run whose estimated duration would overrun the budget is skipped
and listed as such. Writes ``<out>/<name>.{json,md}`` (default benchmarks/results/diffusion_batching).
The runs themselves and their measurements are in ``batching_runs.py``, their ratios in ``batching_ratios.py``,
the model folders in ``batching_workloads.py``, the flags in ``batching_args.py``, the markdown in
``batching_report.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import batching_args  # noqa: E402
import sd3_shapes  # noqa: E402
from batching_args import finish_args  # noqa: E402, F401 (gpu_check)
from batching_ratios import best, ratios  # noqa: E402
from batching_report import render_md, write  # noqa: E402
from batching_runs import Budget, call_kw, run_batched, run_engine, run_sequential  # noqa: E402, F401 (gpu_evidence)
from batching_workloads import workload_class  # noqa: E402

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
    stages: int = 1,
) -> dict[str, Any]:
    """The deploy config the benchmark and the GPU exactness check start AsyncOmni with: ``stages`` diffusion
    stages alike (``output_types``: the first's), on one device."""
    out = []
    for i in range(stages):
        stage: dict[str, Any] = {
            "stage_id": i,
            "dtype": str(dtype).removeprefix("torch."),
            "max_num_seqs": max_num_seqs,
        }
        if device.type == "cuda":
            stage["devices"] = str(device.index or 0)
        if output_types and i == 0:
            stage["engine_output_type"] = output_types
        if threads:
            stage["num_threads"] = threads
        out.append(stage)
    return {"stages": out}


def make_requests(
    n: int, steps: int, size: int, knobs: dict[str, Any], input_image: bool = False
) -> list[dict[str, Any]]:
    """``knobs``: the family's other per-request parameters (guidance, text length), the same for every request
    (the ideal baseline is one diffusers call per batch). ``input_image``: each request carries its own RGBA
    noise image of ``size`` x ``size`` (the alpha varies too) instead of an output size."""
    out = []
    for i in range(n):
        r = {"prompt": PROMPTS[i % len(PROMPTS)], "seed": i, "num_inference_steps": steps, **knobs}
        if input_image:
            r["image"] = Image.fromarray(np.random.default_rng(i).integers(0, 255, (size, size, 4), np.uint8), "RGBA")
        else:
            r |= {"height": size, "width": size}
        out.append(r)
    return out


async def bench(
    args: argparse.Namespace, deadline: float | None = None, on_progress: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """The whole benchmark in one event loop; returns the report (also written by ``main``).
    ``on_progress`` gets the report so far after every run."""
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
        work = workload_class(args.family)(args, Path(folder), device)
        timings["build_folder_s"] = time.perf_counter() - t
        t = time.perf_counter()
        pipe = work.pipeline_class.from_pretrained(folder, dtype=dtype).to(device)
        pipe.set_progress_bar_config(disable=True)
        timings["load_diffusers_s"] = time.perf_counter() - t
        t = time.perf_counter()
        deploy = engine_deploy(device, dtype, max(args.concurrency), threads=args.threads, stages=work.stages)
        omni = AsyncOmni(model=folder, pipeline=work.engine_pipeline, deploy_config=deploy)
        await omni.start()
        timings["start_engine_s"] = time.perf_counter() - t
        try:
            report = await _bench_sizes(args, pipe, omni, work, device, dtype, budget, timings, on_progress)
        finally:
            await omni.shutdown()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return report


async def _bench_sizes(
    args: argparse.Namespace,
    pipe: Any,
    omni: Any,
    work: Any,
    device: torch.device,
    dtype: torch.dtype,
    budget: Budget,
    timings: dict[str, float],
    on_progress: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    knobs, one_per_call = work.knobs, work.one_per_call
    sizes: dict[int, dict[str, Any]] = {}
    order = [(m, c) for m, c in ORDER if c in args.concurrency]
    order += [("diffusers_batched_ideal", c) for c in args.concurrency if ("engine", c) not in order and c != 1]
    order += [("engine", c) for c in args.concurrency if ("engine", c) not in order]
    for size, steps in zip(args.sizes, args.steps):
        t = time.perf_counter()
        reqs = make_requests(args.requests, steps, size, knobs, work.input_image)
        # warm-up: first kernels / cuBLAS handles at this shape, both paths, solo and the largest batch
        warm = [dict(r, num_inference_steps=2) for r in reqs[: max(args.concurrency)]]
        w = run_sequential(pipe, warm[:1], device)
        if not one_per_call:
            run_batched(pipe, warm, len(warm), device)
        await run_engine(omni, warm, len(warm), device)
        warmup_s = time.perf_counter() - t
        facts = work.size_facts(pipe, reqs[0], size, device, dtype)  # (the forward timings: after the warm-up)
        info = {
            "size": size,
            "steps": steps,
            "requests": args.requests,
            "image_tokens": facts.pop("image_tokens"),
            "text_tokens": work.text_tokens,
            "warmup_s": warmup_s,
            "warmup_solo_2step_s": w["duration_s"],
            **facts,
        }
        sizes[size] = {"info": info, "results": {}}
    for rnd in range(args.repeats):
        for size, steps in zip(args.sizes, args.steps):
            entry = sizes[size]
            reqs = make_requests(args.requests, steps, size, knobs, work.input_image)
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
                    on_progress(_report(args, device, work, timings, sizes, budget))
    return _report(args, device, work, timings, sizes, budget)


def _report(
    args: argparse.Namespace,
    device: torch.device,
    work: Any,
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
            "engine_stages": work.stages,
            "preset": work.config["preset"],
            "threads": args.threads,
            "guidance_scale": work.config["guidance_scale"],
            "concurrency": args.concurrency,
            "repeats": args.repeats,
            "requests": args.requests,
            "torch": torch.__version__,
        },
        "model": work.model,
        "timings": timings,
        "sizes": out_sizes,
        "skipped": list(budget.skipped),
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({os.cpu_count()} cores visible)"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return finish_args(batching_args.parser(__doc__.splitlines()[0], RESULTS).parse_args(argv))


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
