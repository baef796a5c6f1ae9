"""Mixed LoRA adapters in one step batch vs one adapter vs serving grouped per adapter (SD3, random weights).

8 concurrent requests (the same steps and size) through omnistage's diffusion engine with 4 adapters
loaded (``lora_modules``):

- ``mixed``: request i uses adapter i % 4, at its own ``lora_scale``: all of them share every forward
  (per-row low-rank deltas);
- ``single``: all 8 use one adapter (the best case for any LoRA server);
- ``grouped``: the same 8 mixed requests served the way a server whose batch key includes the adapter
  must: one adapter's requests batched together, the groups one after another;
- ``base``: the 8 requests without adapters (what LoRA support costs, for reference).

Targets: mixed >= 0.9x single and >= 1.0x grouped, as throughput ratios. Rounds alternate the
order of the modes; the ratio reported is the median over rounds of same-round ratios (a slow stretch of
a shared machine hits both sides of a pair), beside the best-of-rounds ratio.

    .venv/bin/python benchmarks/lora_mixed.py                      # tiny preset, CPU, 1 thread
    python benchmarks/lora_mixed.py --device cuda --preset sd3-medium --size 1024 --rank 16

Writes ``<out>/lora_mixed.{json,md}`` (default benchmarks/results).
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

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import sd3_shapes  # noqa: E402
from batching_runs import Clock  # noqa: E402
from diffusion_batching import PROMPTS, engine_deploy, quiet  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MODES = ("mixed", "single", "grouped", "base")
ADAPTERS = 4
_ids = itertools.count()


def build_adapters(folder: Path, rank: int, n: int) -> list[dict[str, str]]:
    """``n`` random LoRAs of ``rank`` on every attention projection of the folder's MMDiT (diffusers format)."""
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    from omnistage.models.sd3.tiny import LORA_TARGETS
    from omnistage.stages.diffusion.tiny_lora import random_lora, save

    transformer = SD3Transformer2DModel.from_pretrained(folder / "transformer")
    out = []
    for i in range(n):
        path = folder / "loras" / f"style{i}"
        layers = random_lora(transformer, LORA_TARGETS, rank, seed=i, std=0.02)
        save(StableDiffusion3Pipeline, path, layers, {"r": rank, "lora_alpha": rank})
        out.append({"name": f"style{i}", "path": str(path)})
    return out


def requests(mode: str, n: int, steps: int, size: int, msl: int) -> list[dict[str, Any]]:
    reqs = []
    for i in range(n):
        r: dict[str, Any] = {
            "prompt": PROMPTS[i % len(PROMPTS)],
            "seed": i,
            "num_inference_steps": steps,
            "height": size,
            "width": size,
            "guidance_scale": 5.0,
            "max_sequence_length": msl,
        }
        if mode in ("mixed", "grouped"):
            r["lora"], r["lora_scale"] = f"style{i % ADAPTERS}", 0.5 + 0.25 * (i % 3)
        elif mode == "single":
            r["lora"], r["lora_scale"] = "style0", 0.5 + 0.25 * (i % 3)
        reqs.append(r)
    return reqs


async def run_one(omni: Any, r: dict[str, Any], lat: list[float]) -> None:
    s = time.perf_counter()
    prompt = {"prompt": r["prompt"], **({"lora": r["lora"]} if "lora" in r else {})}
    params = {k: v for k, v in r.items() if k not in ("prompt", "lora")}
    async for out in omni.generate(prompt, request_id=f"bench-{next(_ids)}", sampling_params_list=[params]):
        if out.error is not None:
            raise RuntimeError(f"engine request failed: {out.error}")
    lat.append(time.perf_counter() - s)


async def run_mode(omni: Any, mode: str, reqs: list[dict[str, Any]], device: torch.device) -> dict[str, Any]:
    lat: list[float] = []
    engine = omni.replicas(0)[0]
    engine.forward_log.clear()
    with Clock(device) as clock:
        if mode == "grouped":  # one adapter's requests at a time
            for a in range(ADAPTERS):
                await asyncio.gather(*(run_one(omni, r, lat) for r in reqs if r["lora"] == f"style{a}"))
        else:
            await asyncio.gather(*(run_one(omni, r, lat) for r in reqs))
    sizes = [len(ids) for _, ids in engine.forward_log]
    return {
        "mode": mode,
        "duration_s": clock.duration,
        "throughput_rps": len(reqs) / clock.duration,
        "latency_p50_s": statistics.median(lat),
        "forwards": len(sizes),
        "mean_requests_per_forward": sum(sizes) / max(len(sizes), 1),
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from omnistage import AsyncOmni

    quiet()
    device = torch.device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    folder = Path(sd3_shapes.work_dir(5 * 2**30 if args.preset == "sd3-medium" else 2**26))
    try:
        model = sd3_shapes.build(args.preset, folder, device, num_layers=args.num_layers)
        adapters = build_adapters(folder, args.rank, ADAPTERS)
        deploy = engine_deploy(device, dtype, args.requests, threads=args.threads)
        deploy["stages"][0].update(lora_modules=adapters, max_loras=ADAPTERS, max_lora_rank=args.rank)
        omni = AsyncOmni(model=str(folder), deploy_config=deploy)
        await omni.start()
        try:
            msl = model["max_sequence_length"]
            reqs = {m: requests(m, args.requests, args.steps, args.size, msl) for m in MODES}
            for m in MODES:  # warm-up: every path once
                await run_mode(omni, m, reqs[m][:2] if m != "grouped" else reqs[m][:ADAPTERS], device)
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
            for rnd in range(args.rounds):
                for m in MODES if rnd % 2 == 0 else tuple(reversed(MODES)):
                    res = await run_mode(omni, m, reqs[m], device)
                    res["round"] = rnd
                    runs[m].append(res)
                    print(
                        f"round {rnd} {m:8s} {res['throughput_rps']:.3f} req/s "
                        f"({res['mean_requests_per_forward']:.1f} requests per forward)",
                        flush=True,
                    )
        finally:
            await omni.shutdown()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return report(args, model, runs)


def paired(runs: dict[str, list[dict]], a: str, b: str) -> dict[str, float]:
    pairs = [x["throughput_rps"] / y["throughput_rps"] for x, y in zip(runs[a], runs[b])]
    best = max(r["throughput_rps"] for r in runs[a]) / max(r["throughput_rps"] for r in runs[b])
    return {"paired_median": statistics.median(pairs), "best_of_rounds": best, "per_round": pairs}


def report(args: argparse.Namespace, model: dict, runs: dict[str, list[dict]]) -> dict[str, Any]:
    ratios = {
        "mixed_vs_single": paired(runs, "mixed", "single"),
        "mixed_vs_grouped": paired(runs, "mixed", "grouped"),
        "mixed_vs_base": paired(runs, "mixed", "base"),
    }
    return {
        "benchmark": "lora_mixed",
        "device": args.device,
        "dtype": args.dtype,
        "preset": args.preset,
        "num_layers": args.num_layers,
        "size": args.size,
        "steps": args.steps,
        "requests": args.requests,
        "adapters": ADAPTERS,
        "rank": args.rank,
        "threads": args.threads,
        "torch": torch.__version__,
        "model": {k: v for k, v in model.items() if isinstance(v, (int, float, str))},
        "targets": {"mixed_vs_single": 0.9, "mixed_vs_grouped": 1.0},
        "ratios": ratios,
        "runs": runs,
    }


def markdown(rep: dict[str, Any]) -> str:
    lines = [
        f"# Mixed LoRA adapters in one step batch ({rep['preset']}, {rep['device']}, {rep['dtype']})",
        "",
        f"{rep['requests']} concurrent requests, {rep['adapters']} adapters of rank {rep['rank']} on every "
        f"attention projection, {rep['size']}x{rep['size']}, {rep['steps']} steps, guidance 5, "
        f"{rep['threads'] or 'default'} thread(s); torch {rep['torch']}.",
        "",
        "| mode | best throughput (req/s) | median (req/s) | requests per forward |",
        "|---|---|---|---|",
    ]
    for m, rs in rep["runs"].items():
        tp = [r["throughput_rps"] for r in rs]
        lines.append(
            f"| {m} | {max(tp):.3f} | {statistics.median(tp):.3f} | "
            f"{statistics.median(r['mean_requests_per_forward'] for r in rs):.1f} |"
        )
    lines += ["", "| ratio | median of same-round ratios | best of rounds | target |", "|---|---|---|---|"]
    for name, r in rep["ratios"].items():
        target = rep["targets"].get(name)
        lines.append(
            f"| {name.replace('_', ' ')} | {r['paired_median']:.3f} | {r['best_of_rounds']:.3f} | "
            f"{'>= ' + format(target, '.1f') if target else '(cost of LoRA)'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--preset", default="tiny", choices=list(sd3_shapes.PRESETS))
    p.add_argument("--num-layers", type=int, default=None)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine (CPU)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    rep = asyncio.run(bench(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lora_mixed.json").write_text(json.dumps(rep, indent=1))
    (args.out / "lora_mixed.md").write_text(markdown(rep))
    print(markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
