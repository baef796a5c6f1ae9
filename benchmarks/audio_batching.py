"""Text-to-audio step-level batching vs diffusers (random weights), CPU/GPU: Stable Audio or LongCat-AudioDiT.

N requests of mixed durations through omnistage (``AsyncOmni``, one diffusion stage, at most ``c`` in flight)
against (a) the diffusers pipeline called once per request, sequentially, and (b) called once per batch of ``c``
prompts (the ideal static batch: diffusers takes one duration per call, so the batch gets the longest). Stable
Audio denoises the model's whole window whatever the duration, so the work per forward is the same either way;
LongCat-AudioDiT's latent length is the duration, so (b) does the longest clip's work for every prompt of a batch
(and returns clips of the wrong length), while the engine batches only the durations of one frame bucket.

    .venv/bin/python benchmarks/audio_batching.py                       # CPU, 1 thread, 16 requests, c = 1, 4, 8
    .venv/bin/python benchmarks/audio_batching.py --family longcat_audio

The folder is the family's tiny fixture (``omnistage/models/<family>/tiny.py``) with a wider, deeper DiT over a
longer window, so the DiT, not Python, is what a step costs. Runs go in rounds (alternating order); the fastest
of each kind is kept. Writes ``benchmarks/results/audio_batching_<family>.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from batching_runs import Clock, summary  # noqa: E402

RESULTS = Path(__file__).parent / "results"
PROMPTS = ["rain on a tin roof", "church bells", "a dog barking", "waves on a beach", "a cat meowing"]
# per family: the diffusers pipeline, its duration argument, the grown DiT, the longest clip's latent frames
FAMILIES = {
    "stable_audio": dict(
        pipeline="StableAudioPipeline",
        duration_arg="audio_end_in_s",
        guidance=7.0,  # StableAudioPipeline's default
        dit=dict(num_layers=6, attention_head_dim=32, num_attention_heads=4, num_key_value_attention_heads=2),
        frames=256,  # 256 x hop 32 / 16 kHz = 0.512 s: the window every request denoises
    ),
    "longcat_audio": dict(
        pipeline="LongCatAudioDiTPipeline",
        duration_arg="audio_duration_s",
        guidance=4.0,  # LongCatAudioDiTPipeline's default
        dit=dict(dit_dim=128, dit_depth=6, dit_heads=4),
        frames=256,  # 256 x hop 256 / 16 kHz = 4.096 s: the longest request's latent length
    ),
}


def build(folder: Path, family: str) -> None:
    import importlib

    import diffusers

    spec = FAMILIES[family]
    importlib.import_module(f"omnistage.models.{family}.tiny").build(folder)
    pipe = getattr(diffusers, spec["pipeline"]).from_pretrained(folder)
    torch.manual_seed(0)
    cfg = {**dict(pipe.transformer.config), **spec["dit"]}
    if "sample_size" in cfg:  # a DiT of one fixed latent window (every request denoises all of it): grown to it
        cfg["sample_size"] = spec["frames"]
    pipe.transformer = type(pipe.transformer).from_config(cfg).eval()
    with torch.no_grad():  # LongCat's DiT zero-initialises its output layers: random there too (as the fixture)
        for p in pipe.transformer.parameters():
            if not p.any():
                p.normal_(0.0, 0.2)
    pipe.save_pretrained(folder, safe_serialization=True)


def requests(n: int, steps: int, max_s: float) -> list[dict[str, Any]]:
    return [
        {"prompt": PROMPTS[i % len(PROMPTS)], "seed": i, "steps": steps, "duration": max_s * (1 + i % 4) / 4}
        for i in range(n)
    ]


def run_sequential(pipe: Any, reqs: list[dict], device: torch.device, arg: str) -> dict[str, Any]:
    lat = []
    with Clock(device) as clock:
        for r in reqs:
            s = time.perf_counter()
            pipe(r["prompt"], **{arg: r["duration"]}, num_inference_steps=r["steps"],
                 generator=torch.Generator().manual_seed(r["seed"]))  # fmt: skip
            lat.append(time.perf_counter() - s)
    return summary("diffusers_sequential", 1, clock, lat)


def run_batched(pipe: Any, reqs: list[dict], c: int, device: torch.device, arg: str) -> dict[str, Any]:
    lat = []
    with Clock(device) as clock:
        for i in range(0, len(reqs), c):
            chunk = reqs[i : i + c]
            s = time.perf_counter()
            pipe([r["prompt"] for r in chunk], **{arg: max(r["duration"] for r in chunk)},
                 num_inference_steps=chunk[0]["steps"],
                 generator=[torch.Generator().manual_seed(r["seed"]) for r in chunk])  # fmt: skip
            lat.extend([time.perf_counter() - s] * len(chunk))
    return summary("diffusers_batched_ideal", c, clock, lat)


async def run_engine(omni: Any, reqs: list[dict], c: int, device: torch.device) -> dict[str, Any]:
    sem, lat = asyncio.Semaphore(c), []

    async def one(i: int, r: dict) -> None:
        async with sem:
            s = time.perf_counter()
            params = {"num_inference_steps": r["steps"], "seed": r["seed"], "extra_args": {"duration": r["duration"]}}
            async for out in omni.generate(r["prompt"], request_id=f"a{time.monotonic_ns()}-{i}",
                                           sampling_params_list=[params]):  # fmt: skip
                if out.error is not None:
                    raise RuntimeError(out.error)
            lat.append(time.perf_counter() - s)

    with Clock(device) as clock:
        await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
    return summary("engine", c, clock, lat)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    import diffusers

    from omnistage import AsyncOmni

    device = torch.device(args.device)
    spec, arg = FAMILIES[args.family], FAMILIES[args.family]["duration_arg"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build(folder, args.family)
        pipe = getattr(diffusers, spec["pipeline"]).from_pretrained(folder).to(device)
        pipe.set_progress_bar_config(disable=True)
        if "sample_size" in pipe.transformer.config:  # the fixed window, in seconds of audio
            max_s = spec["frames"] * pipe.vae.hop_length / pipe.vae.config.sampling_rate
        else:
            max_s = spec["frames"] * pipe.vae_scale_factor / pipe.sample_rate
        stage = {"stage_id": 0, "dtype": "float32", "max_num_seqs": max(args.concurrency), "num_threads": 1}
        omni = await AsyncOmni(str(folder), deploy_config={"stages": [stage]}).start()
        reqs = requests(args.requests, args.steps, max_s)
        warm = [dict(r, steps=2) for r in reqs[: max(args.concurrency)]]
        run_sequential(pipe, warm[:1], device, arg), run_batched(pipe, warm, len(warm), device, arg)
        await run_engine(omni, warm, len(warm), device)
        runs: dict[tuple[str, int], list[dict]] = {}
        order = [("diffusers_sequential", 1)] + [(m, c) for c in args.concurrency for m in ("engine", "ideal")]
        order = [(m, c) for m, c in order if not (m == "ideal" and c == 1)]
        try:
            for rnd in range(args.repeats):
                for mode, c in order if rnd % 2 == 0 else order[::-1]:
                    if mode == "diffusers_sequential":
                        res = run_sequential(pipe, reqs, device, arg)
                    elif mode == "ideal":
                        res = run_batched(pipe, reqs, c, device, arg)
                    else:
                        res = await run_engine(omni, reqs, c, device)
                    runs.setdefault((res["mode"], c), []).append(res)
                    print(f"round {rnd + 1} {res['mode']} c={c}: {res['throughput_rps']:.3f} req/s", flush=True)
        finally:
            await omni.shutdown()
    best = {k: min(v, key=lambda r: r["duration_s"]) for k, v in runs.items()}
    seq = best[("diffusers_sequential", 1)]
    ratios = {}
    for c in args.concurrency:
        eng = best[("engine", c)]
        ideal = seq if c == 1 else best[("diffusers_batched_ideal", c)]
        ratios[str(c)] = {
            "vs_ideal": eng["throughput_rps"] / ideal["throughput_rps"],
            "cpu_vs_ideal": eng["requests_per_cpu_s"] / ideal["requests_per_cpu_s"],
            "vs_sequential": eng["throughput_rps"] / seq["throughput_rps"],
        }
    return {
        "config": {"device": str(device), "cpu_count": os.cpu_count(), "torch": torch.__version__, **vars(args)},
        "model": {
            "family": args.family,
            "dit_class": type(pipe.transformer).__name__,
            "dit": spec["dit"],
            "guidance": spec["guidance"],
            "latent_frames": spec["frames"],
            "max_seconds": max_s,
            "dit_parameters": sum(p.numel() for p in pipe.transformer.parameters()),
        },  # fmt: skip
        "durations_s": sorted({r["duration"] for r in reqs}),
        "runs": list(best.values()),
        "ratios": ratios,
    }


def render(report: dict[str, Any]) -> str:
    m, cfg = report["model"], report["config"]
    lines = [
        f"# Text-to-audio step-level batching vs diffusers ({m['family']}, {cfg['device']}, float32)",
        "",
        f"{m['dit_class']} with {m['dit_parameters'] / 1e6:.1f}M parameters (the tiny fixture's, grown: {m['dit']}, "
        f"{m['latent_frames']} latent frames = {m['max_seconds']:g} s), random weights; guidance {m['guidance']:g} "
        "(CFG rows); "
        f"{cfg['requests']} requests of durations {report['durations_s']} s, {cfg['steps']} steps; best of "
        f"{cfg['repeats']} rounds. Ideal: one diffusers call per `concurrency` prompts at the batch's longest duration "
        "(diffusers takes one per call). Generated by `benchmarks/audio_batching.py`.",
        "",
        "| concurrency | mode | throughput (req/s) | p50 latency (s) | CPU s |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(report["runs"], key=lambda r: (r["concurrency"], r["mode"])):
        lines.append(
            f"| {r['concurrency']} | {r['mode']} | {r['throughput_rps']:.3f} | {r['latency_p50_s']:.3f} | "
            f"{r['cpu_s']:.1f} |"
        )
    lines += [
        "",
        "| concurrency | engine / ideal | engine / ideal (CPU time) | engine / sequential |",
        "|---|---|---|---|",
    ]
    for c, r in report["ratios"].items():
        lines.append(f"| {c} | {r['vs_ideal']:.3f} | {r['cpu_vs_ideal']:.3f} | {r['vs_sequential']:.3f} |")
    lines += ["", "Wall-clock ratios on a shared CPU machine swing with other processes' load; CPU time is steadier."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="stable_audio", choices=sorted(FAMILIES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    torch.set_num_threads(1)
    report = asyncio.run(bench(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"audio_batching_{args.family}"
    (out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{name}.md").write_text(render(report))
    print(render(report))


if __name__ == "__main__":
    main()
