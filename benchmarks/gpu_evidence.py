"""The second one-shot GPU check: real-size random-weight Qwen-Image (~20B), FLUX.1-dev (~12B) and
Wan2.1-T2V (1.3B by default, 14B opt-in as ``wan_14b``) (``real_shapes.py``, bf16) on one GPU, in one time budget:

- ``flux`` / ``qwen_image`` / ``wan``: bf16 engine output vs the diffusers call (max abs diff of the latents,
  same seed), then the engine vs diffusers sequential and vs the ideal batched diffusers call at c=1/4/8, solo
  latency vs one diffusers call, GPU peak memory (1024², Wan 480p x 33 frames, 8 steps);
- ``lora`` (FLUX shape): 8 concurrent requests over 4 rank-32 adapters in one forward (mixed) vs grouped per
  adapter vs no adapter;
- ``step_cache`` (FLUX shape): first-block cache and TeaCache at two thresholds each, speed-up solo and at c=8
  and the fraction of steps reused (random weights say nothing about quality: that stays the CPU demo's
  measurement in diffusion_acceleration.md);
- ``offload`` (Qwen-Image, the largest): ``offload: model`` / ``layer`` vs none, one solo request: GPU peak above
  the start and time, reported as MiB saved per second lost.

    bash scripts/gpu_check.sh --suite evidence2                  # GPU machine (carry .whl), writes to $OUT
    GPU_CHECK_SKIP_WHEELS=1 PYTHON=.venv/bin/python OUT=/tmp/e2 bash scripts/gpu_check.sh --suite evidence2 \
        --tiny --device cpu                                        # CPU smoke: tiny shapes, 2 steps

    bash scripts/gpu_check.sh --suite evidence2 --parts flux,lora,step_cache       # the two halves that each
    bash scripts/gpu_check.sh --suite evidence2 --parts qwen_image,offload,wan     # fit 8 minutes (estimated)
    bash scripts/gpu_check.sh --suite evidence2 --parts wan_14b --requests 4 --concurrency 1,4

Not yet run on a GPU (as of writing): no results exist, and the time estimates in ``SHARES`` are arithmetic
(FLOPs at ~650 TFLOP/s, weights loaded twice), not measurements. The remaining time is shared among the parts
left in proportion to ``SHARES``; within a part a run whose estimate would pass the part's deadline is skipped and
listed, and a part that cannot start is listed as skipped. Everything measured is written after each part
(gpu_evidence.{json,md} in --out). Exit status 0 when no part failed and every exactness case is within
``TOLERANCE``. On the CPU (``--tiny``) offloading moves nothing: its rows there only prove the path runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

import diffusion_acceleration as da
import diffusion_batching as db
import gpu_exactness
import lora_mixed
import real_shapes
import sd3_shapes
import torch
from gpu_evidence_report import TARGETS, render_md, write

# In this order a model folder is deleted before the next one is written (Qwen-Image's is 41 GB: disk and
# /dev/shm hold one at a time).
PARTS = ("flux", "lora", "step_cache", "qwen_image", "offload", "wan")
# The remaining time is split in these proportions: each part's estimated H200 seconds with every run in
# (loading the weights twice dominates the small ones). They add up to ~2 runs of 8 minutes: one run with
# every part skips runs in each; two (--parts flux,lora,step_cache / qwen_image,offload,wan) skip none.
SHARES = {"flux": 150, "lora": 100, "step_cache": 150, "qwen_image": 250, "offload": 150, "wan": 80, "wan_14b": 300}
NEEDS = {"lora": "flux", "step_cache": "flux", "offload": "qwen_image"}  # the folder a part reuses
# bf16 on a GPU: relative L2 of the latents (gpu_exactness's solo tolerance); fp32 on the CPU: 0 expected
TOLERANCE = {"bfloat16": {"rel_l2": 1e-3}, "float32": {"max_abs": 1e-5}}
# Cache thresholds: guesses for ~30% / ~50% reused steps at real size (the tiny SD3's random-weight values);
# the reused fraction measured is reported beside each, so a rerun can move them.
CACHE = {"first_block": (0.25, 0.4), "teacache": (0.1, 0.2)}
PROMPT, SEED = "a red cat on a chair", 11


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _mem_start(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device) / 2**20


def _mem_peak_above(device: torch.device, start: float) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**20 - start


class Ctx:
    def __init__(self, args: argparse.Namespace, device: torch.device, dtype: torch.dtype):
        self.args, self.device, self.dtype = args, device, dtype
        self.dname = str(dtype).removeprefix("torch.")
        self.folders: dict[str, tuple[Path, dict[str, Any]]] = {}

    def request(self, family: str) -> dict[str, Any]:
        shape = real_shapes.SHAPES[family]
        return {
            **(shape.tiny_request if self.args.tiny else shape.request),
            "num_inference_steps": int(self.args.steps or (2 if self.args.tiny else shape.steps)),
        }

    def folder(self, family: str) -> tuple[Path, dict[str, Any]]:
        if family not in self.folders:
            need = 2**26 if self.args.tiny else int(2.2 * real_shapes.NOMINAL_PARAMS[family])  # bf16 + margin
            path = Path(sd3_shapes.work_dir(need))
            # --tiny with --num-layers: the real widths at that depth (a CPU check of the real-size build)
            tiny = self.args.tiny and self.args.num_layers is None
            self.folders[family] = (path, real_shapes.build(family, path, self.device, tiny, self.args.num_layers))
        return self.folders[family]

    def drop(self, family: str) -> None:
        path, _ = self.folders.pop(family, (None, None))
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    async def engine(self, folder: Path, output: str | None = None, **stage: Any) -> Any:
        from omnistage import AsyncOmni

        deploy = db.engine_deploy(
            self.device, self.dtype, max(self.args.concurrency), output_types=output, threads=self.args.threads
        )
        deploy["stages"][0].update(stage)
        return await AsyncOmni(model=str(folder), deploy_config=deploy).start()


def _requests(base: dict[str, Any], n: int) -> list[dict[str, Any]]:
    return [{"prompt": db.PROMPTS[i % len(db.PROMPTS)], "seed": i, **base} for i in range(n)]


async def family_part(ctx: Ctx, family: str, deadline: float) -> dict[str, Any]:
    """Exactness, then sequential / engine / ideal runs at each concurrency (the issue's points first)."""
    import diffusers

    shape, device, args = real_shapes.SHAPES[family], ctx.device, ctx.args
    t = time.perf_counter()
    folder, model = ctx.folder(family)
    timings = {"build_folder_s": time.perf_counter() - t}
    t = time.perf_counter()
    cls = getattr(diffusers, shape.pipeline_class)
    try:  # straight onto the GPU (no 41 GB host copy first)
        pipe = cls.from_pretrained(folder, dtype=ctx.dtype, device_map=device.type) if device.type == "cuda" else None
    except Exception as e:  # an older diffusers may refuse it: the usual way, then
        print(f"[{family}] device_map={device.type} refused ({type(e).__name__}: {e}); loading on the host", flush=True)
        pipe = None
        _free(device)
    pipe = pipe if pipe is not None else cls.from_pretrained(folder, dtype=ctx.dtype).to(device)
    pipe.set_progress_bar_config(disable=True)
    timings["load_diffusers_s"] = time.perf_counter() - t
    t = time.perf_counter()
    omni = await ctx.engine(folder, output=f"{shape.output},latent")
    timings["start_engine_s"] = time.perf_counter() - t
    req = ctx.request(family)
    res: dict[str, Any] = {"model": model, "request": req, "timings": timings}
    try:
        out, _ = await gpu_exactness._generate(omni, PROMPT, {**req, "seed": SEED, "output_type": "latent"})
        want = pipe(PROMPT, generator=torch.Generator().manual_seed(SEED), output_type="latent", **db.call_kw(req))
        want = want.frames if shape.output == "video" else want.images
        cmp = gpu_exactness.compare(out.latents, want)
        tol = TOLERANCE[ctx.dname]
        res["exactness"] = {
            **cmp,
            "tolerance": tol,
            "ok": bool(cmp.get("finite") and all(cmp.get(k, float("inf")) <= v for k, v in tol.items())),
        }
        print(f"[{family}] engine vs diffusers: {res['exactness']}", flush=True)

        conc = args.concurrency
        reqs = _requests(req, args.requests)
        warm = [dict(r, num_inference_steps=2) for r in reqs[: max(conc)]]
        t = time.perf_counter()
        w = db.run_sequential(pipe, warm[:1], device)
        db.run_batched(pipe, warm, len(warm), device)
        await db.run_engine(omni, warm, len(warm), device)
        timings["warmup_s"] = time.perf_counter() - t
        budget, done = db.Budget(deadline), {}
        order = [(m, c) for m, c in db.ORDER if c in conc]
        order += [
            (m, c)
            for c in conc
            for m in ("diffusers_batched_ideal", "engine")
            if (m, c) not in order and not (c == 1 and m != "engine")
        ]
        for mode, c in order:
            known = done.get((mode, c)) or done.get(("diffusers_sequential", 1))
            est = known["duration_s"] if known else w["duration_s"] / 2 * req["num_inference_steps"] * len(reqs)
            if not budget.allows(1.1 * est, {"family": family, "mode": mode, "concurrency": c}):
                continue
            if mode == "diffusers_sequential":
                r = db.run_sequential(pipe, reqs, device)
            elif mode == "diffusers_batched_ideal":
                r = db.run_batched(pipe, reqs, c, device)
            else:
                r = await db.run_engine(omni, reqs, c, device)
            done[(mode, c)] = r
            print(
                f"[{family}] {mode} c={c}: {r['throughput_rps']:.3f} req/s, p50 {r['latency_p50_s']:.3f}s", flush=True
            )
        runs = [done[k] for k in sorted(done, key=lambda k: (k[1], k[0]))]
        for r in runs:  # one round: db.ratios's paired medians read these
            r.update(round=1, all_rounds=[1], all_durations_s=[r["duration_s"]])
        res.update(runs=runs, ratios=db.ratios(runs, conc), skipped=budget.skipped)
    finally:
        await omni.shutdown()
        del pipe
        _free(device)
    top, r1 = res["ratios"].get(str(max(args.concurrency)), {}), res["ratios"].get("1", {})
    res["targets"] = {
        "concurrency": max(args.concurrency),
        "vs_ideal_at_top_c": top.get("vs_ideal"),
        "vs_sequential_at_top_c": top.get("vs_sequential"),
        "solo_latency_vs_diffusers": r1.get("latency_vs_solo"),
    }
    return res


async def lora_part(ctx: Ctx, deadline: float) -> dict[str, Any]:
    from diffusers import FluxPipeline, FluxTransformer2DModel

    from omnistage.models.flux.tiny import LORA_TARGETS
    from omnistage.stages.diffusion.tiny_lora import random_lora, save

    args = ctx.args
    folder, _ = ctx.folder("flux")
    rank = args.lora_rank
    with torch.device("meta"):  # only the layer shapes are read
        shapes = FluxTransformer2DModel.from_config(FluxTransformer2DModel.load_config(folder / "transformer"))
    adapters = []
    for i in range(lora_mixed.ADAPTERS):
        path = folder / "loras" / f"style{i}"
        save(
            FluxPipeline,
            path,
            random_lora(shapes, LORA_TARGETS, rank, seed=i, std=0.01),
            {"r": rank, "lora_alpha": rank},
        )
        adapters.append({"name": f"style{i}", "path": str(path)})
    del shapes
    omni = await ctx.engine(folder, lora_modules=adapters, max_loras=len(adapters), max_lora_rank=rank, max_num_seqs=8)
    req = ctx.request("flux")
    size, steps, msl = req["height"], req["num_inference_steps"], req["max_sequence_length"]
    modes = ("mixed", "grouped", "base")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    skipped = []
    try:
        reqs = {m: lora_mixed.requests(m, 8, steps, size, msl) for m in modes}
        for r in (r for rs in reqs.values() for r in rs):
            r["guidance_scale"] = req["guidance_scale"]  # FLUX's embedded guidance, not SD3's CFG
        t = time.perf_counter()
        for m in modes:
            await lora_mixed.run_mode(omni, m, [dict(r, num_inference_steps=2) for r in reqs[m]], ctx.device)
        warm = time.perf_counter() - t
        for rnd in range(args.lora_rounds):
            for m in modes if rnd % 2 == 0 else modes[::-1]:
                est = runs[m][-1]["duration_s"] if runs[m] else warm / 3 / 2 * steps
                if time.monotonic() + 1.1 * est > deadline:
                    skipped.append({"mode": m, "round": rnd + 1, "estimate_s": round(est, 2)})
                    continue
                r = await lora_mixed.run_mode(omni, m, reqs[m], ctx.device)
                r["round"] = rnd + 1
                runs[m].append(r)
                print(
                    f"[lora] round {rnd + 1} {m}: {r['throughput_rps']:.3f} req/s "
                    f"({r['mean_requests_per_forward']:.1f} per forward)",
                    flush=True,
                )
    finally:
        await omni.shutdown()
        _free(ctx.device)
    ratios = {}
    for a, b in (("mixed", "grouped"), ("mixed", "base")):
        pairs = {r["round"]: r["throughput_rps"] for r in runs[b]}
        same = [r["throughput_rps"] / pairs[r["round"]] for r in runs[a] if r["round"] in pairs]
        ratios[f"{a}_vs_{b}"] = statistics.median(same) if same else None
    return {
        "rank": rank,
        "adapters": len(adapters),
        "requests": 8,
        "request": req,
        "runs": runs,
        "ratios": ratios,
        "skipped": skipped,
    }


async def step_cache_part(ctx: Ctx, deadline: float) -> dict[str, Any]:
    folder, _ = ctx.folder("flux")
    req = ctx.request("flux")
    params = dict(req)
    n = 8
    thresholds = {"first_block": ctx.args.first_block_thresholds, "teacache": ctx.args.teacache_thresholds}
    configs = [("off", None, None)] + [
        (m, float(t), {"cache": {"method": m, "threshold": float(t)}})
        for m, ts in thresholds.items()
        for t in ts.split(",")
        if t
    ]
    rows, skipped, off = [], [], {}
    for name, thr, acc in configs:
        est = off.get("total_s", 0.0)
        if time.monotonic() + 1.2 * est + (5 if est else 0) > deadline:
            skipped.append({"method": name, "threshold": thr, "estimate_s": round(est, 2)})
            continue
        t0 = time.perf_counter()
        omni = await ctx.engine(folder, **({"acceleration": acc} if acc else {}), max_num_seqs=n)
        try:
            await da.run_workload(omni, dict(params, num_inference_steps=2), 1, 1)  # warm-up
            row: dict[str, Any] = {"method": name, "threshold": thr}
            for c, count in ((1, 1), (n, n)):
                wall, _, _, reused = await da.run_workload(omni, params, count, c)
                row[f"c{c}_s"] = wall
                row[f"c{c}_reused_fraction"] = sum(reused) / (params["num_inference_steps"] * count)
        finally:
            await omni.shutdown()
            _free(ctx.device)
        if name == "off":
            off = {**row, "total_s": time.perf_counter() - t0}
        else:
            row.update(speedup_solo=off["c1_s"] / row["c1_s"], speedup_c8=off[f"c{n}_s"] / row[f"c{n}_s"])
        rows.append(row)
        print(f"[step_cache] {row}", flush=True)
    return {
        "request": req,
        "requests_at_c8": n,
        "rows": rows,
        "skipped": skipped,
        "note": "random weights: the reused fraction and the speed-up are real, quality is not measured here "
        "(see diffusion_acceleration.md, trained demo model)",
    }


async def offload_part(ctx: Ctx, deadline: float) -> dict[str, Any]:
    folder, _ = ctx.folder("qwen_image")
    req = ctx.request("qwen_image")
    rows, skipped = [], []
    for mode in ("none", "model", "layer"):
        est = rows[0]["time_s"] * (3 if mode != "none" else 1) if rows else 0.0
        if time.monotonic() + est > deadline:
            skipped.append({"offload": mode, "estimate_s": round(est, 2)})
            continue
        _free(ctx.device)
        start = _mem_start(ctx.device)
        acc = {} if mode == "none" else {"acceleration": {"offload": mode}}
        try:
            omni = await ctx.engine(folder, max_num_seqs=1, **acc)
        except Exception as e:  # e.g. offloading needs an accelerator: recorded, the other modes still run
            rows.append({"offload": mode, "error": f"{type(e).__name__}: {e}"})
            continue
        try:
            await da.run_workload(omni, dict(req, num_inference_steps=2), 1, 1)
            wall, _, _, _ = await da.run_workload(omni, req, 1, 1)
            rows.append(
                {"offload": mode, "time_s": wall, "gpu_peak_above_start_mib": _mem_peak_above(ctx.device, start)}
            )
        finally:
            await omni.shutdown()
            _free(ctx.device)
        print(f"[offload] {rows[-1]}", flush=True)
    base = next((r for r in rows if r["offload"] == "none" and "time_s" in r), None)
    for r in rows:
        if base and r is not base and "time_s" in r and r["gpu_peak_above_start_mib"] is not None:
            saved = base["gpu_peak_above_start_mib"] - r["gpu_peak_above_start_mib"]
            lost = r["time_s"] - base["time_s"]
            r.update(mib_saved=saved, s_lost=lost, mib_saved_per_s_lost=saved / lost if lost > 0 else None)
    return {"family": "qwen_image", "request": req, "rows": rows, "skipped": skipped}


def run(args: argparse.Namespace, out: Path, env: dict[str, Any], start: float) -> int:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("float32" if device.type == "cpu" else "bfloat16"))
    args.concurrency = [int(c) for c in str(args.concurrency or ("1,4" if args.tiny else "1,4,8")).split(",")]
    args.requests = args.requests or (4 if args.tiny else 8)
    ctx = Ctx(args, device, dtype)
    parts = [p for p in args.parts.split(",") if p]
    doc: dict[str, Any] = {
        "environment": env,
        "dtype": ctx.dname,
        "tiny": args.tiny,
        "parts": {},
        "seconds": {},
        "errors": {},
        "skipped_parts": [],
        "targets": TARGETS,
    }
    deadline = start + args.budget_s - 10  # kept back for writing and shutting down
    write(out, doc)
    for i, part in enumerate(parts):
        left = deadline - time.monotonic()
        share = SHARES[part] / sum(SHARES[p] for p in parts[i:])
        part_deadline = time.monotonic() + left * share
        if left < args.min_part_s:
            doc["skipped_parts"].append(part)
            print(f"skipped (budget): part {part}, {left:.0f}s left", flush=True)
        else:
            t = time.monotonic()
            try:
                if part in real_shapes.SHAPES:
                    coro = family_part(ctx, part, part_deadline)
                else:
                    coro = {"lora": lora_part, "step_cache": step_cache_part, "offload": offload_part}[part](
                        ctx, part_deadline
                    )
                doc["parts"][part] = asyncio.run(coro)
            except Exception:
                doc["errors"][part] = traceback.format_exc()
                print(doc["errors"][part], flush=True)
            doc["seconds"][part] = time.monotonic() - t
        for fam in list(ctx.folders):  # a folder is kept only while a later part reuses it
            if all(NEEDS.get(p, p) != fam for p in parts[i + 1 :]):
                ctx.drop(fam)
        _free(device)
        write(out, doc)
    doc["seconds"]["total"] = time.monotonic() - start
    write(out, doc)
    print(render_md(doc))
    exact = [p["exactness"]["ok"] for p in doc["parts"].values() if "exactness" in p]
    return 0 if not doc["errors"] and all(exact) else 1


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--tiny",
        action="store_true",
        help="the CPU smoke path: tiny fixtures and sizes, 2 steps "
        "(with --num-layers N: the real widths, N layers deep)",
    )
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, in order (default {','.join(PARTS)})")
    ap.add_argument("--lora-rank", type=int, default=32)
    ap.add_argument("--lora-rounds", type=int, default=2)
    for method, ts in CACHE.items():
        ap.add_argument(
            f"--{method.replace('_', '-')}-thresholds",
            default=",".join(map(str, ts)),
            help=f"step cache {method} thresholds (default {ts}; comma-separated)",
        )
    ap.add_argument("--min-part-s", type=float, default=20, help="a part with less time left is skipped")
