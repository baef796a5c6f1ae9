"""Diffusion acceleration vs off: step caching (first-block cache, TeaCache) over thresholds, torch.compile,
CPU offload (model, layer) and VAE tiling, on the built-in demo model (trained weights: real trajectories)
and the tiny SD3 of the batching benchmark (4 MMDiT blocks, random weights).

Every configuration is its own ``AsyncOmni`` (one diffusion stage, in process, ``acceleration:`` in its
deploy config), all started first and fed the same prompts and seeds:

- solo: the requests one after another (concurrency 1);
- batched: all requests at once (concurrency 8 by default): the step cache then decides per row inside
  shared forwards.

Throughput speed-up = time off / time with the method, in the same mode. On CPU the time is the
process's CPU time (``--clock cpu``, the default there): on a shared machine wall time mostly measures the
neighbours; ``--clock wall`` for a dedicated machine or a GPU. Both are recorded. The runs go in rounds
(every other round in reverse order, so drift hits all configurations alike) and the fastest run of each
is kept. Quality: PSNR and max |diff| of the final images (uint8 -> [0, 1]) against the images of "off"
in the same mode; ``psnr_db`` is null where they are identical.

Families: ``demo`` (its default 20 steps, every method), ``demo-50`` (the same model at 50 steps, the
step cache only: caching pays with more, closer steps) and ``sd3-tiny`` (28 steps, SD3's default, every
method); on a GPU also ``sd3-medium`` (SD3-Medium-shaped, random weights, 512 px), where offloading's memory
effect shows. The image families with a block layout (``ovis_image``, ``longcat_image``, ``sana``,
``pixart_sigma``, ``flux2_klein``: family_shapes.py's grown random-weight folders, 20 steps, the step cache
only) also compare "off" with diffusers' own ``__call__``:

    .venv/bin/python benchmarks/diffusion_acceleration.py --quick --families sana pixart_sigma ovis_image \
        --output benchmarks/results/diffusion_acceleration_image_families.json
    .venv/bin/python benchmarks/diffusion_acceleration.py --quick --families longcat_image --requests 4 \
        --concurrency 4 --output benchmarks/results/diffusion_acceleration_longcat_image.json  # 512 text tokens

    python benchmarks/diffusion_acceleration.py --device cuda --families demo sd3-medium --rounds 1 \
        --output benchmarks/results/diffusion_acceleration_gpu.json

    .venv/bin/python benchmarks/diffusion_acceleration.py                      # full run -> benchmarks/results/
    .venv/bin/python benchmarks/diffusion_acceleration.py --quick --output /tmp/acc.json

Writes the JSON list of rows {method, family, speedup, psnr_db, max_abs_diff, ...} to ``--output``
(default benchmarks/results/diffusion_acceleration.json), a markdown summary and a speed-up vs PSNR plot
next to it (``.md``, ``.png``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import family_shapes
import sd3_shapes
from batching_runs import call_kw

RESULTS = Path(__file__).parent / "results"
# captions in the demo's training vocabulary (demo/shapes.py); the tiny SD3 takes any text
PROMPTS = [
    "a red circle on the left",
    "a blue square in the center on a white background",
    "a green triangle on the right",
    "a small yellow circle in the center",
    "a large purple square on the left on a black background",
    "a cyan triangle in the center",
    "an orange circle on the right on a gray background",
    "a pink square in the center",
]
# Thresholds per model: a relative change is a property of the model (the random-weight tiny SD3's first-block
# residual moves 0.2-0.45 per step, the trained demo's far less). (full run, --quick)
DEMO = {
    "first_block": ([0.04, 0.06, 0.08, 0.1, 0.12, 0.15], [0.06, 0.1]),
    "teacache": ([0.05, 0.1, 0.15, 0.2, 0.3], [0.1, 0.2]),
}
FAMILIES = {  # name -> (steps, thresholds, every method or the step cache only)
    "demo": (20, DEMO, True),
    "demo-50": (50, DEMO, False),
    "sd3-tiny": (
        28,
        {"first_block": ([0.15, 0.25, 0.35, 0.45], [0.25, 0.4]), "teacache": ([0.05, 0.1, 0.2, 0.3], [0.1, 0.2])},
        True,
    ),
    # GPU only (--device cuda): SD3-Medium's MMDiT and VAE shapes, random weights (sd3_shapes.py), 512 px;
    # where offloading's memory effect shows
    "sd3-medium": (28, {"first_block": ([0.1, 0.3], [0.1, 0.3]), "teacache": ([0.1, 0.3], [0.1, 0.3])}, True),
}
# the image families with a block layout: family_shapes.py's grown folders (random weights, 4+ blocks), the
# step cache only; their "off" images are also compared with diffusers' own __call__ (solo, same prompt and seed)
IMAGE_FAMILIES = {"ovis_image": 64, "longcat_image": 64, "sana": 128, "pixart_sigma": 64, "flux2_klein": 64}  # px
FAMILIES |= {
    name: (20, {"first_block": ([0.1, 0.2, 0.3, 0.45], [0.2, 0.4]), "teacache": ([0.1, 0.2, 0.4], [0.2, 0.4])}, False)
    for name in IMAGE_FAMILIES
}
DEFAULT_FAMILIES = ["demo", "demo-50", "sd3-tiny"]


@dataclass
class Config:
    name: str  # row "method"
    acceleration: dict[str, Any] | None
    threshold: float | None = None
    durations: dict[int, list[float]] = field(default_factory=dict)  # concurrency -> run times (--clock)
    wall: dict[int, list[float]] = field(default_factory=dict)
    cpu: dict[int, list[float]] = field(default_factory=dict)
    images: dict[int, list[np.ndarray]] = field(default_factory=dict)  # concurrency -> images (first run)
    reused: dict[int, list[int]] = field(default_factory=dict)  # concurrency -> reused steps per request
    peak_mib: float | None = None  # CUDA: the configuration's own peak (weights + warm-up runs) above what ran before
    omni: Any = None


def configs(family: str, quick: bool, compile_: bool) -> list[Config]:
    _, thresholds, every_method = FAMILIES[family]
    out = [Config("off", None)]
    for method, (full, short) in thresholds.items():
        for t in short if quick else full:
            out.append(Config(method, {"cache": {"method": method, "threshold": t}}, t))
    if not every_method:
        return out
    if compile_:
        out.append(Config("compile", {"compile": True}))
    out += [
        Config("offload_model", {"offload": "model"}),
        Config("offload_layer", {"offload": "layer"}),
        Config("vae_tiling", {"vae_tiling": True}),
    ]
    return out


def family_setup(name: str, workdir: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(model folder, request params, description) of a benchmark family."""
    steps = FAMILIES[name][0]
    if name.startswith("demo"):
        from omnistage.models.demo import DEFAULT_PARAMS, WEIGHTS

        info_file = WEIGHTS / "training_info.json"
        info = json.loads(info_file.read_text()) if info_file.exists() else {}
        return (
            str(WEIGHTS),
            {**DEFAULT_PARAMS, "num_inference_steps": steps},
            {"weights": str(WEIGHTS), "training": info},
        )
    folder = workdir / name
    if name in IMAGE_FAMILIES:
        desc = family_shapes.build(name, folder)
        size = IMAGE_FAMILIES[name]
        return str(folder), {"height": size, "width": size, "num_inference_steps": steps, **desc["knobs"]}, desc
    preset = name.removeprefix("sd3-")
    device = torch.device("cuda" if preset != "tiny" else "cpu")  # random init of 2B parameters: on the GPU
    desc = sd3_shapes.build(preset, folder, device)
    size = 64 if preset == "tiny" else 512
    params = {
        "height": size,
        "width": size,
        "num_inference_steps": steps,
        "guidance_scale": 5.0,
        "max_sequence_length": sd3_shapes.PRESETS[preset]["max_sequence_length"],
    }
    return str(folder), params, desc


async def run_workload(
    omni: Any, params: dict[str, Any], n: int, concurrency: int
) -> tuple[float, float, list[np.ndarray], list[int]]:
    """n requests (prompt i, seed i), at most ``concurrency`` at a time: (wall s, process CPU s, images,
    reused steps per request)."""
    images: list[Any] = [None] * n
    reused = [0] * n
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            last = None
            async for last in omni.generate(PROMPTS[i % len(PROMPTS)], sampling_params_list=[{**params, "seed": i}]):
                pass
            if last is None or last.error is not None:
                raise RuntimeError(f"request {i} failed: {last and last.error}")
            images[i] = np.asarray(last.images[0])
            reused[i] = int(last.metrics[0].get("num_steps_reused", 0))

    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, time.process_time() - c0, images, reused


def diffusers_images(folder: str, pipeline_class: str, params: dict[str, Any], n: int) -> list[np.ndarray]:
    """Requests 0..n-1 (prompt i, seed i) through diffusers' own pipeline, one call each."""
    import diffusers

    pipe = getattr(diffusers, pipeline_class).from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return [
        np.asarray(
            pipe(
                prompt=PROMPTS[i % len(PROMPTS)], generator=torch.Generator().manual_seed(i), **call_kw(params)
            ).images[0]
        )
        for i in range(n)
    ]


def quality(images: list[np.ndarray], reference: list[np.ndarray]) -> tuple[float | None, float]:
    """(PSNR in dB over all images, None if identical; max |diff|), pixels in [0, 1]."""
    a = np.stack(images).astype(np.float64) / 255
    b = np.stack(reference).astype(np.float64) / 255
    mse = float(((a - b) ** 2).mean())
    return (None if mse == 0 else 10 * math.log10(1.0 / mse)), float(np.abs(a - b).max())


async def bench_family(family: str, args: argparse.Namespace, workdir: Path) -> tuple[list[dict], dict]:
    from omnistage import AsyncOmni

    folder, params, desc = family_setup(family, workdir)
    cfgs = configs(family, args.quick, args.compile)
    modes = [1, args.concurrency]
    cuda = args.device == "cuda"
    for c in cfgs:
        stage: dict[str, Any] = {"stage_id": 0, "max_num_seqs": args.concurrency}
        if cuda:
            stage["devices"] = "0"
        if c.acceleration is not None:
            stage["acceleration"] = c.acceleration
        if cuda:  # the engines started before are idle: what grows now is this configuration's
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        c.omni = await AsyncOmni(model=folder, deploy_config={"stages": [stage]}).start()
        # warm-up (compile happens here): one request alone, then a full batch
        await run_workload(c.omni, params, 1, 1)
        await run_workload(c.omni, params, args.concurrency, args.concurrency)
        if cuda:
            torch.cuda.synchronize()
            c.peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
        print(f"[{family}] ready: {c.name} {c.threshold or ''}", flush=True)
    try:
        for r in range(args.rounds):
            order = cfgs if r % 2 == 0 else cfgs[::-1]
            for c in order:
                for mode in modes:
                    wall, cpu, images, reused = await run_workload(c.omni, params, args.requests, mode)
                    c.wall.setdefault(mode, []).append(wall)
                    c.cpu.setdefault(mode, []).append(cpu)
                    c.durations.setdefault(mode, []).append(cpu if args.clock == "cpu" else wall)
                    c.images.setdefault(mode, images)
                    c.reused.setdefault(mode, reused)
            print(f"[{family}] round {r + 1}/{args.rounds} done", flush=True)
    finally:
        for c in cfgs:
            await c.omni.shutdown()
    off = cfgs[0]
    if "pipeline_class" in desc:  # a grown family_shapes folder names its diffusers class: compare with its __call__
        desc["off_vs_diffusers"] = dict(
            zip(
                ("psnr_db", "max_abs_diff"),
                quality(off.images[1], diffusers_images(folder, desc["pipeline_class"], params, args.requests)),
            )
        )
    rows = []
    for c in cfgs[1:]:
        for mode in modes:
            psnr, diff = quality(c.images[mode], off.images[mode])
            steps = params["num_inference_steps"]
            rows.append(
                {
                    "method": c.name,
                    "family": family,
                    "threshold": c.threshold,
                    "concurrency": mode,
                    "speedup": min(off.durations[mode]) / min(c.durations[mode]),
                    "psnr_db": psnr,
                    "max_abs_diff": diff,
                    "reused_fraction": sum(c.reused[mode]) / (steps * args.requests),
                    "steps": steps,
                    "clock": args.clock,
                    "time_s": min(c.durations[mode]),
                    "off_time_s": min(off.durations[mode]),
                    "wall_speedup": min(off.wall[mode]) / min(c.wall[mode]),
                    "cpu_s": c.cpu[mode],
                    "wall_s": c.wall[mode],
                    "off_cpu_s": off.cpu[mode],
                    "off_wall_s": off.wall[mode],
                    "peak_mib": c.peak_mib,
                    "off_peak_mib": off.peak_mib,
                }
            )
    return rows, {"family": family, "params": params, "model": desc}


def retention(rows: list[dict], concurrency: int) -> list[dict]:
    """Per cache threshold: batched speed-up / solo speed-up."""
    out = []

    def key(r):
        return (r["family"], r["method"], r["threshold"])

    solo = {key(r): r for r in rows if r["concurrency"] == 1}
    for r in rows:
        if r["concurrency"] == concurrency and r["threshold"] is not None and key(r) in solo:
            s = solo[key(r)]
            out.append(
                {
                    "family": r["family"],
                    "method": r["method"],
                    "threshold": r["threshold"],
                    "solo_speedup": s["speedup"],
                    "batched_speedup": r["speedup"],
                    "retention": r["speedup"] / s["speedup"],
                    "solo_psnr_db": s["psnr_db"],
                }
            )
    return out


def fmt(v: Any, spec: str = ".2f") -> str:
    if v is None:
        return "identical"
    return format(v, spec) if isinstance(v, float) else str(v)


def markdown(rows: list[dict], ret: list[dict], meta: dict) -> str:
    title = (
        f"# Diffusion acceleration ({meta['device']}, {meta['threads']} thread(s), {meta['requests']} requests, "
        f"rounds={meta['rounds']}, clock={meta['clock']}{', quick' if meta['quick'] else ''})"
    )
    intro = (
        f"Speed-up of throughput vs off in the same mode ({meta['clock']} time, fastest of the rounds; wall-clock "
        "speed-up alongside); PSNR / max |diff| of the final images vs off's images (pixels in [0, 1])."
    )
    header = (
        "| family | steps | method | threshold | concurrency | speed-up | wall speed-up | PSNR dB | max abs diff | "
        "reused steps |"
    )
    lines = [title, "", intro, "", header, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['steps']} | {r['method']} | "
            f"{fmt(r['threshold'], 'g') if r['threshold'] else '-'} | {r['concurrency']} | {r['speedup']:.2f}x | "
            f"{r['wall_speedup']:.2f}x | {fmt(r['psnr_db'], '.1f')} | {r['max_abs_diff']:.4f} | "
            f"{r['reused_fraction']:.0%} |"
        )
    peaks = [r for r in rows if r.get("peak_mib") is not None and r["concurrency"] == 1]
    if peaks:
        lines += [
            "",
            "Peak GPU memory of each configuration (weights + warm-up runs), MiB:",
            "",
            "| family | method | threshold | peak MiB | off MiB |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['family']} | {r['method']} | {fmt(r['threshold'], 'g') if r['threshold'] else '-'} | "
            f"{r['peak_mib']:.0f} | {r['off_peak_mib']:.0f} |"
            for r in peaks
        ]
    notes = (
        "Notes: offload on a CPU-only machine moves nothing (its hooks only cost time); vae_tiling changes "
        "the decode only where the image is larger than the VAE's tile (the demo's tile is its 64 px output, "
        "the tiny SD3's is 32 px), and there equals diffusers' own tiled decode (tests/stages/diffusion/"
        "test_acceleration.py)."
    )
    lines += ["", notes]
    refs = [(f["family"], f["model"]["off_vs_diffusers"]) for f in meta["families"] if "off_vs_diffusers" in f["model"]]
    if refs:
        lines += [
            "",
            "Off vs diffusers' own `__call__` (solo, the same prompts and seeds):",
            "",
            "| family | PSNR dB | max abs diff |",
            "|---|---|---|",
        ]
        lines += [f"| {name} | {fmt(r['psnr_db'], '.1f')} | {r['max_abs_diff']:.4f} |" for name, r in refs]
    lines += [
        "",
        f"Batched (concurrency {meta['concurrency']}) speed-up as a share of the solo speed-up:",
        "",
        "| family | method | threshold | solo | batched | retention | solo PSNR dB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in ret:
        lines.append(
            f"| {r['family']} | {r['method']} | {r['threshold']:g} | {r['solo_speedup']:.2f}x | "
            f"{r['batched_speedup']:.2f}x | {r['retention']:.0%} | {fmt(r['solo_psnr_db'], '.1f')} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    families = sorted({r["family"] for r in rows})
    fig, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4.5), squeeze=False)
    for ax, fam in zip(axes[0], families):
        for (method, c), style in zip(
            itertools.product(("first_block", "teacache"), sorted({r["concurrency"] for r in rows})),
            ("o-", "o--", "s-", "s--"),
        ):
            pts = sorted(
                (r["psnr_db"] or 99.0, r["speedup"], r["threshold"])
                for r in rows
                if r["family"] == fam and r["method"] == method and r["concurrency"] == c
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{method}, concurrency {c}")
                for x, y, t in pts:
                    ax.annotate(f"{t:g}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_title(f"{fam}: step cache over thresholds")
        ax.set_xlabel("PSNR vs uncached (dB; identical outputs plotted at 99)")
        ax.set_ylabel("throughput speed-up")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


async def main_async(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    rows, families = [], []
    with tempfile.TemporaryDirectory(prefix="omnistage-accel-") as tmp:
        for fam in args.families:
            r, desc = await bench_family(fam, args, Path(tmp))
            rows += r
            families.append(desc)
            write(rows, families, args)  # after every family: a long run cut short keeps what it measured
    print(markdown(rows, retention(rows, args.concurrency), meta_of(families, args)))


def meta_of(families: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "threads": args.threads,
        "requests": args.requests,
        "rounds": args.rounds,
        "clock": args.clock,
        "concurrency": args.concurrency,
        "quick": args.quick,
        "compile": args.compile,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "families": families,
    }


def write(rows: list[dict], families: list[dict], args: argparse.Namespace) -> None:
    meta, ret = meta_of(families, args), retention(rows, args.concurrency)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    out.with_suffix(".meta.json").write_text(json.dumps({**meta, "retention": ret}, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(markdown(rows, ret, meta))
    plot(rows, out.with_suffix(".png"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two thresholds per cache method, one round, no compile")
    p.add_argument("--output", default=str(RESULTS / "diffusion_acceleration.json"))
    p.add_argument("--families", nargs="+", default=DEFAULT_FAMILIES, choices=list(FAMILIES))
    p.add_argument("--requests", type=int, default=8, help="requests per run")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=None, help="default 2, quick 1")
    p.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default=None,
        help="what the speed-up divides (see above); default cpu on CPU, wall on CUDA",
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: stage on GPU 0 (bf16), plus each configuration's peak GPU memory (offload)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="include torch.compile (inductor; minutes of compiling on CPU). Default: on unless --quick",
    )
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.clock = args.clock or ("wall" if args.device == "cuda" else "cpu")
    if "sd3-medium" in args.families and args.device != "cuda":
        p.error("--families sd3-medium needs --device cuda")
    if args.compile is None:
        args.compile = not args.quick
    return args


if __name__ == "__main__":
    asyncio.run(main_async(parse_args()))
