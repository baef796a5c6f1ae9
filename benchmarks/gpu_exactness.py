"""omnistage's diffusion engine against the diffusers pipeline's own ``__call__``, on any device and dtype.

The same checks as tests/stages/diffusion/test_sd3_engine.py and tests/models/wan/test_wan_engine.py (solo request
== diffusers call; concurrent requests == their solo results), driven through the public API
(``AsyncOmni``) on the tiny fixtures (``omnistage.testing.tiny``), without pytest or vLLM, so that
they run on a GPU machine. Each comparison is measured, recorded and judged against a stated
tolerance (``TOLERANCE``); nothing is asserted here: the caller decides what to do with a failure.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusion_batching import engine_deploy

# What counts as agreement. Solo: the engine runs diffusers' own operations in diffusers' order, so on
# one device any difference is a bug (on CPU it is exactly 0 in both dtypes). fp32: max abs diff of the
# latents. bf16: relative L2 error, 1e-3 = well under what one differently rounded operation per step
# leaves (one bf16 rounding is up to 2^-8 relative: ~1e-2 after a few steps on the tiny models).
# Batched vs solo: a batch of other size picks other GEMM kernels, so rows may differ by rounding.
TOLERANCE = {
    ("solo", "float32"): {"max_abs": 1e-5},
    ("solo", "bfloat16"): {"rel_l2": 1e-3},
    ("batched", "float32"): {"max_abs": 1e-4},
    ("batched", "bfloat16"): {"rel_l2": 2e-2},
}

# Mirrors the unit tests' cases (small sizes: the point is exactness, not speed), per tiny fixture. The diffusers
# class and what the engine outputs come from the folder and its pipeline's declaration (``declared``).
CASES: dict[str, dict[str, Any]] = {
    "sd3": {
        "solo": dict(num_inference_steps=5, guidance_scale=7.0, height=32, width=48),
        "batched": [
            ("a red cat", dict(num_inference_steps=6, seed=1, guidance_scale=7.0)),
            ("green square", dict(num_inference_steps=6, seed=2, guidance_scale=1.0)),
            ("blue chair at night", dict(num_inference_steps=6, seed=3, guidance_scale=3.5)),
        ],
        "batched_common": dict(height=32, width=32),
    },
    "wan": {
        "solo": dict(
            num_inference_steps=4, guidance_scale=5.0, height=32, width=32, num_frames=5, max_sequence_length=16
        ),
        "batched": [
            ("a red cat", dict(num_inference_steps=5, seed=1, guidance_scale=5.0)),
            ("green square", dict(num_inference_steps=5, seed=2, guidance_scale=1.0)),
            ("city skyline", dict(num_inference_steps=5, seed=3, guidance_scale=3.0)),
        ],
        "batched_common": dict(height=32, width=32, num_frames=5, max_sequence_length=16),
    },
}
PROMPT, NEGATIVE, SEED = "a red cat on a chair", "blurry", 11

_ids = itertools.count()


def compare(got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    a, b = got.detach().double().cpu(), want.detach().double().cpu()
    if a.shape != b.shape:
        return {"shape_mismatch": [list(a.shape), list(b.shape)], "finite": False}
    diff = (a - b).abs()
    return {
        "max_abs": diff.max().item(),
        "rel_l2": ((a - b).norm() / b.norm().clamp_min(1e-30)).item(),
        "exact": bool(torch.equal(got.cpu(), want.cpu())),
        "finite": bool(torch.isfinite(a).all()),
    }


def compare_pixels(got: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    if got.shape != want.shape:
        return {"shape_mismatch": [list(got.shape), list(want.shape)]}
    d = np.abs(got.astype(int) - want.astype(int))
    return {"max_level_diff": int(d.max()), "frac_values_differing": float((d > 0).mean())}


def judge(kind: str, dtype: str, result: dict[str, Any]) -> dict[str, Any]:
    tol = TOLERANCE[(kind, dtype)]
    ok = result.get("finite", False) and all(result.get(k, float("inf")) <= v for k, v in tol.items())
    return {**result, "tolerance": tol, "ok": bool(ok)}


async def _generate(omni: Any, prompt: str | dict, params: dict[str, Any]) -> tuple[Any, int]:
    """The final output of one request, and the most requests seen running in the stage meanwhile."""
    last, most = None, 0
    async for out in omni.generate(prompt, request_id=f"x{next(_ids)}", sampling_params_list=[params]):
        if out.error is not None:
            raise RuntimeError(f"engine request failed: {out.error}")
        most = max(most, omni.stage_stats()[0].running)
        last = out
    return last, most


def declared(folder: str) -> tuple[str, str]:
    """The diffusers class ``folder``'s model_index names, and what its pipeline's final stage outputs."""
    import omnistage.models  # noqa: F401 (registers the families)
    from omnistage.pipeline import ModelFolder, resolve_pipeline

    final = next(s for s in resolve_pipeline(folder).stages if s.final)
    return ModelFolder(Path(folder)).diffusers_class, final.output


def _reference_pixels(output: str, result: Any) -> np.ndarray:
    if output == "image":
        return np.asarray(result.images[0])
    return (result.frames[0] * 255).round().astype(np.uint8)  # diffusers' np video in [0, 1], rounded as for PIL


def _engine_pixels(output: str, out: Any) -> np.ndarray:
    return np.asarray(out.images[0]) if output == "image" else out.video


async def check_family(family: str, folder: str, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    import diffusers

    from omnistage import AsyncOmni

    case, dname = CASES[family], str(dtype).removeprefix("torch.")
    pipeline_class, output = declared(folder)
    t0 = time.perf_counter()
    ref = getattr(diffusers, pipeline_class).from_pretrained(folder, dtype=dtype).to(device)
    ref.set_progress_bar_config(disable=True)
    deploy = engine_deploy(device, dtype, 8, output_types=f"{output},latent")
    omni = AsyncOmni(model=folder, deploy_config=deploy)
    await omni.start()
    res: dict[str, Any] = {"family": family, "dtype": dname, "device": str(device)}
    try:
        kw = case["solo"]
        out, _ = await _generate(omni, PROMPT, {**kw, "seed": SEED, "output_type": "latent"})
        want = ref(PROMPT, generator=torch.Generator().manual_seed(SEED), output_type="latent", **kw)
        want = want.images if output == "image" else want.frames
        res["solo_latent"] = judge("solo", dname, compare(out.latents, want))

        out, _ = await _generate(omni, {"prompt": PROMPT, "negative_prompt": NEGATIVE}, {**kw, "seed": SEED})
        want = ref(PROMPT, negative_prompt=NEGATIVE, generator=torch.Generator().manual_seed(SEED), **kw)
        res["solo_decoded"] = compare_pixels(_engine_pixels(output, out), _reference_pixels(output, want))

        common = {**case["batched_common"], "output_type": "latent"}
        solo = [(await _generate(omni, p, {**common, **p_kw}))[0].latents for p, p_kw in case["batched"]]
        together = await asyncio.gather(*(_generate(omni, p, {**common, **p_kw}) for p, p_kw in case["batched"]))
        comps = [compare(o.latents, s) for s, (o, _) in zip(solo, together)]
        worst = max(comps, key=lambda c: (not c["finite"], c.get("max_abs", float("inf"))))
        res["batched_vs_solo"] = judge("batched", dname, worst)
        res["batched_vs_solo"]["max_running_seen"] = max(m for _, m in together)
        res["batched_vs_solo"]["requests"] = len(together)
    finally:
        await omni.shutdown()
        del ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
    res["seconds"] = time.perf_counter() - t0
    res["ok"] = bool(
        res["solo_latent"]["ok"] and res["batched_vs_solo"]["ok"] and res["batched_vs_solo"]["max_running_seen"] >= 2
    )
    return res


async def run_all(
    device: torch.device, dtypes: list[torch.dtype], families: list[str], workdir: Path, deadline: float | None = None
) -> dict[str, Any]:
    """Every (family, dtype) case that fits before ``deadline``; errors are recorded, not raised."""
    from omnistage.testing.tiny import build

    cases, skipped = [], []
    for family in families:
        folder = str(build(family, workdir / f"tiny-{family}"))
        for dtype in dtypes:
            name = f"{family}/{str(dtype).removeprefix('torch.')}"
            if deadline is not None and time.monotonic() > deadline:
                skipped.append(name)
                continue
            try:
                cases.append(await check_family(family, folder, device, dtype))
            except Exception as e:  # one broken case must not hide the others' results
                cases.append(
                    {
                        "family": family,
                        "dtype": str(dtype).removeprefix("torch."),
                        "ok": False,
                        "error": f"{type(e).__name__}: {e}",
                    }
                )
            print(f"exactness {name}: {_line(cases[-1])}", flush=True)
    return {
        "cases": cases,
        "skipped": skipped,
        "tolerance": {f"{k}/{d}": v for (k, d), v in TOLERANCE.items()},
        "ok": bool(cases) and all(c["ok"] for c in cases) and not skipped,
    }


def _line(c: dict[str, Any]) -> str:
    if "error" in c:
        return "ERROR " + c["error"]
    s, b = c["solo_latent"], c["batched_vs_solo"]
    return (
        f"{'ok' if c['ok'] else 'FAIL'}: solo max|d| {s.get('max_abs', float('nan')):.3g} "
        f"(rel {s.get('rel_l2', float('nan')):.3g}, exact {s.get('exact')}), decoded max level diff "
        f"{c['solo_decoded'].get('max_level_diff')}, batched vs solo max|d| {b.get('max_abs', float('nan')):.3g} "
        f"(rel {b.get('rel_l2', float('nan')):.3g}, {b['max_running_seen']} running)"
    )


def render_md(report: dict[str, Any]) -> str:
    lines = [
        "| family | dtype | solo latent max abs diff | solo rel L2 | bit-exact | decoded max level diff | "
        "batched vs solo max abs | batched rel L2 | most running | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cases"]:
        if "error" in c:
            lines.append(f"| {c['family']} | {c['dtype']} | error: {c['error'][:120]} | | | | | | | FAIL |")
            continue
        s, d, b = c["solo_latent"], c["solo_decoded"], c["batched_vs_solo"]
        lines.append(
            f"| {c['family']} | {c['dtype']} | {s.get('max_abs', float('nan')):.3g} | "
            f"{s.get('rel_l2', float('nan')):.3g} | {s.get('exact')} | {d.get('max_level_diff')} | "
            f"{b.get('max_abs', float('nan')):.3g} | {b.get('rel_l2', float('nan')):.3g} | "
            f"{b['max_running_seen']} | {'ok' if c['ok'] else 'FAIL'} |"
        )
    tol = ", ".join(f"{k}: {v}" for k, v in report["tolerance"].items())
    lines += [
        "",
        f"Tolerances: {tol}. Solo = one request alone vs the diffusers pipeline's `__call__` with the same "
        "seed (CPU generator); batched = 3 concurrent requests (other prompts, seeds, guidance) vs each alone.",
    ]
    if report["skipped"]:
        lines.append(f"Skipped for the time budget: {', '.join(report['skipped'])}.")
    return "\n".join(lines) + "\n"
