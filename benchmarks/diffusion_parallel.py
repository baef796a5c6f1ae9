"""One diffusion replica on 1 device vs on 2 (CFG-parallel, Ulysses sequence-parallel): latency and throughput.

Three replicas of the same random-weight SD3 model (``sd3_shapes.py`` presets), each an ``AsyncOmni`` with one
diffusion stage run in its own processes (``process: mp``, so the baseline pays the same transport):

- ``1 device``: the ordinary single-device engine;
- ``cfg_parallel_size=2``: uncond rows on one rank, cond rows on the other;
- ``ulysses_degree=2``: every row's token sequence split over the two ranks.

On CPU every rank gets one thread (``num_threads: 1``), so the baseline uses one core and the 2-rank replicas
two. Every request uses CFG (guidance 5), so CFG-parallel has rows to split even when a request runs alone.
Per round and mode: ``--solo`` requests one after another (latency), then ``--requests`` requests at
``--concurrency`` (throughput); the modes' order alternates between rounds and the ratios are medians of
same-round pairs, so a slow stretch of a shared machine hits baseline and candidate alike. Before timing,
one request per mode is compared with the baseline's latents (they must agree within 1e-4 in fp32).

    .venv/bin/python benchmarks/diffusion_parallel.py                    # CPU, wide preset, 1 thread per rank
    python benchmarks/diffusion_parallel.py --device cuda                # 2 GPUs (devices 0,1), sd3-medium, bf16
    python benchmarks/diffusion_parallel.py --device cuda --devices 2,3 --size 1024 --steps 20

Writes ``<out>/diffusion_parallel.{json,md}`` (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch

sys.path.insert(0, str(Path(__file__).parent))
import sd3_shapes
from batching_runs import pct
from diffusion_batching import PROMPTS, quiet

RESULTS = Path(__file__).parent / "results"
GUIDANCE = 5.0
MODES: dict[str, dict[str, int] | None] = {
    "1 device": None,
    "cfg_parallel_size=2": {"cfg_parallel_size": 2},
    "ulysses_degree=2": {"ulysses_degree": 2},
}
EXACT_TOL = 1e-4  # fp32 on CPU; reported, not enforced, in bf16 on GPUs
_ids = itertools.count()


def deploy(parallel: dict[str, int] | None, args: argparse.Namespace) -> dict[str, Any]:
    stage: dict[str, Any] = {
        "stage_id": 0,
        "process": "mp",
        "dtype": args.dtype,
        "max_num_seqs": args.concurrency,
        "engine_output_type": "image,latent",
    }
    if args.threads:
        stage["num_threads"] = args.threads
    if parallel:
        stage["parallel_config"] = parallel
    if args.device == "cuda":
        stage["devices"] = ",".join(args.devices[:2] if parallel else args.devices[:1])
    return {"stages": [stage]}


def request(i: int, args: argparse.Namespace, **over: Any) -> tuple[str, dict[str, Any]]:
    params = {
        "seed": i,
        "num_inference_steps": args.steps,
        "height": args.size,
        "width": args.size,
        "guidance_scale": GUIDANCE,
        "max_sequence_length": args.max_sequence_length,
        **over,
    }
    return PROMPTS[i % len(PROMPTS)], params


async def final(omni: Any, prompt: str, params: dict[str, Any]) -> Any:
    last = None
    async for last in omni.generate(prompt, request_id=f"bench-{next(_ids)}", sampling_params_list=[params]):
        if last.error is not None:
            raise RuntimeError(f"request failed: {last.error}")
    if last is None or not last.finished:
        raise RuntimeError("request ended without a finished output")
    return last


def rank_pids(omni: Any) -> list[int]:
    engine = omni.replicas(0)[0]
    return list(getattr(engine, "rank_pids", None) or [engine.pid])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RankCpu:
    """CPU seconds each rank process spends during a run: on a CPU machine whose cores are shared, the
    busiest rank's CPU per request is the latency the replica would have with an idle core per rank."""

    def __init__(self, omni: Any):
        self.pids = rank_pids(omni)

    def __enter__(self) -> RankCpu:
        self.start = [cpu_s(p) for p in self.pids]
        return self

    def __exit__(self, *exc: object) -> None:
        self.used = [cpu_s(p) - s for p, s in zip(self.pids, self.start)]


async def run_solo(omni: Any, args: argparse.Namespace) -> dict[str, Any]:
    lat = []
    with RankCpu(omni) as cpu:
        for i in range(args.solo):
            s = time.perf_counter()
            await final(omni, *request(i, args))
            lat.append(time.perf_counter() - s)
    return {
        "latency_median_s": statistics.median(lat),
        "latencies_s": lat,
        "solo_rank_cpu_per_request_s": [c / args.solo for c in cpu.used],
    }


async def run_concurrent(omni: Any, args: argparse.Namespace) -> dict[str, Any]:
    sem = asyncio.Semaphore(args.concurrency)
    lat: list[float] = []

    async def one(i: int) -> None:
        async with sem:
            s = time.perf_counter()
            await final(omni, *request(i, args))
            lat.append(time.perf_counter() - s)

    t0 = time.perf_counter()
    with RankCpu(omni) as cpu:
        await asyncio.gather(*(one(i) for i in range(args.requests)))
    duration = time.perf_counter() - t0
    return {
        "duration_s": duration,
        "throughput_rps": args.requests / duration,
        "latency_p50_s": statistics.median(lat),
        "latency_p99_s": pct(lat, 99),
        "concurrent_rank_cpu_per_request_s": [c / args.requests for c in cpu.used],
    }


def _burn(seconds: float, out: Any) -> None:
    t, c, x = time.perf_counter(), time.process_time(), 0
    while time.perf_counter() - t < seconds:
        x += 1
    out.put(time.process_time() - c)


def parallel_capacity(seconds: float = 2.0) -> dict[str, float]:
    """How many cores this script's processes actually get right now: CPU seconds per wall second of one busy
    process, then of two at once (2.0 on two idle cores; on a shared machine possibly no more than one)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out: dict[str, float] = {}
    for n in (1, 2):
        q = ctx.Queue()
        procs = [ctx.Process(target=_burn, args=(seconds, q)) for _ in range(n)]
        for p in procs:
            p.start()
        used = sum(q.get() for _ in procs)
        for p in procs:
            p.join()
        out[f"{n}_process{'es' if n > 1 else ''}"] = used / seconds
    return out


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from omnistage import AsyncOmni

    quiet()
    folder = sd3_shapes.work_dir(5 * 2**30 if args.preset == "sd3-medium" else 2**26)
    timings: dict[str, float] = {}
    engines: dict[str, Any] = {}
    try:
        t = time.perf_counter()
        model = sd3_shapes.build(args.preset, Path(folder), torch.device(args.device), num_layers=args.num_layers)
        timings["build_folder_s"] = time.perf_counter() - t
        for mode, parallel in MODES.items():
            t = time.perf_counter()
            engines[mode] = await AsyncOmni(model=folder, deploy_config=deploy(parallel, args)).start()
            timings[f"start {mode} s"] = time.perf_counter() - t
        # warm-up (first kernels at this shape) and the exactness check: one request per mode, latents compared
        check = request(100, args, output_type="latent")
        ref = None
        exact: dict[str, float] = {}
        for mode, omni in engines.items():
            latents = (await final(omni, *check)).latents.float()
            ref = latents if ref is None else ref
            exact[mode] = (latents - ref).abs().max().item()
            await run_concurrent(omni, argparse.Namespace(**{**vars(args), "requests": args.concurrency, "steps": 2}))
        if args.dtype == "float32":
            bad = {m: d for m, d in exact.items() if d > EXACT_TOL}
            if bad:
                raise SystemExit(f"2-rank latents differ from the single-device engine's: {bad}")
        rounds: list[dict[str, Any]] = []
        names = list(engines)
        capacity = [parallel_capacity()] if args.device == "cpu" else []
        for rnd in range(args.rounds):
            for mode in names if rnd % 2 == 0 else names[::-1]:
                solo = await run_solo(engines[mode], args)
                conc = await run_concurrent(engines[mode], args)
                rounds.append({"round": rnd + 1, "mode": mode, **solo, **conc})
                print(
                    f"round {rnd + 1} {mode}: solo {solo['latency_median_s']:.3f}s, "
                    f"{conc['throughput_rps']:.3f} req/s at {args.concurrency}",
                    flush=True,
                )
        if args.device == "cpu":
            capacity.append(parallel_capacity())
    finally:
        for omni in engines.values():
            await omni.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
    return report(args, model, timings, exact, rounds, capacity)


def report(
    args: argparse.Namespace,
    model: dict[str, Any],
    timings: dict[str, float],
    exact: dict[str, float],
    rounds: list[dict[str, Any]],
    capacity: list[dict[str, float]],
) -> dict[str, Any]:
    base = {r["round"]: r for r in rounds if r["mode"] == "1 device"}
    summary = {}
    for mode in MODES:
        mine = [r for r in rounds if r["mode"] == mode]
        cpu = {}
        if args.device == "cpu":
            # the busiest rank's CPU per request against the 1-device replica's, same round
            for kind in ("solo", "concurrent"):
                key = f"{kind}_rank_cpu_per_request_s"
                cpu[f"cpu_bound_speedup_{kind}"] = statistics.median(
                    max(base[r["round"]][key]) / max(r[key]) for r in mine
                )
                cpu[f"{kind}_rank_cpu_per_request_s_median"] = [
                    statistics.median(x) for x in zip(*(r[key] for r in mine))
                ]
        summary[mode] = {
            **cpu,
            "solo_latency_s_best": min(r["latency_median_s"] for r in mine),
            "throughput_rps_best": max(r["throughput_rps"] for r in mine),
            "concurrent_latency_p50_s_best": min(r["latency_p50_s"] for r in mine),
            # same-round pairs: candidate vs the baseline run next to it
            "speedup_solo_latency": statistics.median(
                base[r["round"]]["latency_median_s"] / r["latency_median_s"] for r in mine
            ),
            "speedup_throughput": statistics.median(
                r["throughput_rps"] / base[r["round"]]["throughput_rps"] for r in mine
            ),
            "max_abs_diff_vs_1_device": exact[mode],
        }
    return {
        "config": {
            "device": args.device,
            "device_name": device_name(args),
            "devices": args.devices,
            "dtype": args.dtype,
            "preset": args.preset,
            "threads_per_rank": args.threads,
            "size": args.size,
            "steps": args.steps,
            "guidance_scale": GUIDANCE,
            "max_sequence_length": args.max_sequence_length,
            "solo": args.solo,
            "requests": args.requests,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "cpu_count": os.cpu_count(),
            "load_avg_at_end": os.getloadavg(),
            "torch": torch.__version__,
            "note": args.note,
        },
        "parallel_capacity": capacity,
        "model": model,
        "timings": timings,
        "summary": summary,
        "rounds": rounds,
    }


def device_name(args: argparse.Namespace) -> str:
    if args.device == "cuda":
        return ", ".join(torch.cuda.get_device_name(int(d)) for d in args.devices[:2])
    return f"CPU ({os.cpu_count()} cores visible)"


def render_md(rep: dict[str, Any]) -> str:
    cfg, model = rep["config"], rep["model"]
    tc = model["transformer_config"]
    threads = f", {cfg['threads_per_rank']} thread per rank" if cfg["threads_per_rank"] else ""
    about = (
        f"SD3 transformer {model['transformer_params'] / 1e6:.1f}M parameters ({tc['num_layers']} layers x "
        f"{tc['num_attention_heads'] * tc['attention_head_dim']} wide, patch {tc['patch_size']}), random weights; "
        f"{cfg['size']}x{cfg['size']}, {cfg['steps']} steps, guidance {cfg['guidance_scale']} (2 rows per "
        f"request), T5 length {cfg['max_sequence_length']}{threads}. Per round and mode: {cfg['solo']} requests "
        f"one after another (latency), then {cfg['requests']} at concurrency {cfg['concurrency']} (throughput); "
        f"{cfg['rounds']} rounds, mode order alternating. Speedups are medians of same-round ratios against "
        f"the 1-device run. torch {cfg['torch']}. Generated by `benchmarks/diffusion_parallel.py`."
    )
    lines = [
        f"# One diffusion replica on 1 vs 2 devices ({cfg['preset']} SD3, {cfg['device_name']}, {cfg['dtype']})",
        "",
        about,
        "",
    ]
    if cfg["note"]:
        load = ", ".join(f"{x:.1f}" for x in cfg["load_avg_at_end"])
        lines += [f"**Conditions:** {cfg['note']} (load average at the end: {load}).", ""]
    lines += [
        (
            "| mode | solo latency (s) | speedup | throughput (req/s) | speedup | p50 latency at concurrency (s) | "
            "max abs diff vs 1 device |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for mode, s in rep["summary"].items():
        lines.append(
            f"| {mode} | {s['solo_latency_s_best']:.3f} | {s['speedup_solo_latency']:.2f}x | "
            f"{s['throughput_rps_best']:.3f} | {s['speedup_throughput']:.2f}x | "
            f"{s['concurrent_latency_p50_s_best']:.3f} | {s['max_abs_diff_vs_1_device']:.1e} |"
        )
    lines += ["", "Latency and throughput columns: best round of each mode; all rounds are in the JSON."]
    if rep["parallel_capacity"]:
        caps = ", ".join(f"{c['1_process']:.2f} / {c['2_processes']:.2f}" for c in rep["parallel_capacity"])
        cpu_note = (
            "**What the machine gave:** cores' worth of CPU one busy process / two busy processes got, "
            f"probed before the first round and after the last: {caps}. When two processes get no more than one, "
            "two ranks cannot beat one in wall time, whatever the code does. So the CPU time each rank "
            "process used is recorded too: the busiest rank's CPU per request against the 1-device "
            "replica's is the speedup the replica would show with an idle core per rank (it counts the "
            "ranks' communication work, not their waiting):"
        )
        lines += [
            "",
            cpu_note,
            "",
            (
                "| mode | CPU per request, per rank, solo (s) | CPU-bound speedup, solo | at concurrency (s) | "
                "CPU-bound speedup, concurrency |"
            ),
            "|---|---|---|---|---|",
        ]
        for mode, s in rep["summary"].items():
            solo = " + ".join(f"{x:.3f}" for x in s["solo_rank_cpu_per_request_s_median"])
            conc = " + ".join(f"{x:.3f}" for x in s["concurrent_rank_cpu_per_request_s_median"])
            lines.append(
                f"| {mode} | {solo} | {s['cpu_bound_speedup_solo']:.2f}x | {conc} | "
                f"{s['cpu_bound_speedup_concurrent']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--devices",
        default="0,1",
        help="cuda: the GPUs (the first for the baseline, the first two for the 2-rank replicas)",
    )
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--preset", choices=sorted(sd3_shapes.PRESETS), help="default: wide on CPU, sd3-medium on CUDA")
    ap.add_argument("--num-layers", type=int, help="override the preset's transformer depth")
    ap.add_argument("--size", type=int, help="square image size (default 96 on CPU, 1024 on CUDA)")
    ap.add_argument("--steps", type=int, help="denoising steps (default 4 on CPU, 20 on CUDA)")
    ap.add_argument("--solo", type=int, default=3, help="requests one after another per round (latency)")
    ap.add_argument("--requests", type=int, default=8, help="requests per throughput run")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, help="torch threads per rank (default 1 on CPU)")
    ap.add_argument("--note", default="", help="conditions of this run, written into the results")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    gpu = args.device == "cuda"
    args.devices = [d.strip() for d in args.devices.split(",")]
    if gpu and (len(args.devices) < 2 or torch.cuda.device_count() < 2):
        raise SystemExit(f"--devices: 2 GPUs needed ({torch.cuda.device_count()} visible, {args.devices} given)")
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.preset = args.preset or ("sd3-medium" if gpu else "wide")
    args.size = args.size or (1024 if gpu else 96)
    args.steps = args.steps or (20 if gpu else 4)
    args.threads = args.threads or (None if gpu else 1)
    args.max_sequence_length = sd3_shapes.PRESETS[args.preset]["max_sequence_length"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rep = asyncio.run(bench(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "diffusion_parallel.json").write_text(json.dumps(rep, indent=2))
    (out / "diffusion_parallel.md").write_text(render_md(rep))
    print(render_md(rep))


if __name__ == "__main__":
    main()
