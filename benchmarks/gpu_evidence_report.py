"""The report of ``gpu_evidence.py``: gpu_evidence.json as measured and gpu_evidence.md, one
table per part, with the targets the parts are judged against."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import real_shapes

TARGETS = {"vs_ideal_c8_min": 0.9, "solo_latency_max": 1.05, "lora_vs_grouped_min": 1.0, "lora_vs_base_min": 0.9}


def render_md(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    where = env.get("gpu") or f"CPU ({env['cpu_count']} cores)"
    lines = [
        f"# GPU evidence 2 (real-size models) on {where}",
        "",
        f"torch {env['torch']} (CUDA {env['cuda']}), diffusers {env['diffusers']}; omnistage "
        f"{env.get('omnistage_commit') or '(commit unknown)'}; dtype {doc['dtype']}, tiny={doc['tiny']}. "
        "Random weights of the published shapes (real_shapes.py). Parts took "
        + ", ".join(f"{k} {v:.0f}s" for k, v in doc["seconds"].items())
        + ".",
        "",
    ]
    if doc["skipped_parts"]:
        lines += [f"Skipped for the time budget: {', '.join(doc['skipped_parts'])}.", ""]
    for part, err in doc["errors"].items():
        lines += [f"**{part} failed:** `{err.strip().splitlines()[-1]}` (traceback in gpu_evidence.json)", ""]
    fams = [f for f in real_shapes.SHAPES if f in doc["parts"]]
    if fams:
        lines += [
            "## Batching per family",
            "",
            "| family | params | request | engine vs diffusers (max abs / rel L2) | top c | engine / ideal at "
            "top c | engine / sequential at top c | solo latency / diffusers call | peak memory (MiB) | "
            "skipped runs |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for f in fams:
            p = doc["parts"][f]
            e, t = p.get("exactness", {}), p.get("targets", {})
            peak = max(
                (r.get("gpu_peak_alloc_mib") or r.get("peak_rss_mib") or 0 for r in p.get("runs", [])), default=None
            )
            rq = p["request"]
            n = p["model"]["transformer_params"]
            lines.append(
                f"| {f} | {f'{n / 1e9:.2f}B' if n >= 1e9 else f'{n / 1e6:.2f}M'} | {rq.get('width')}x"
                f"{rq.get('height')}{' x ' + str(rq['num_frames']) if 'num_frames' in rq else ''}, "
                f"{rq['num_inference_steps']} steps | {_f(e.get('max_abs'), '.3g')} / "
                f"{_f(e.get('rel_l2'), '.3g')} | {t.get('concurrency')} | {_f(t.get('vs_ideal_at_top_c'))} | "
                f"{_f(t.get('vs_sequential_at_top_c'))} | {_f(t.get('solo_latency_vs_diffusers'))} | "
                f"{_f(peak, '.0f')} | {len(p.get('skipped', []))} |"
            )
        lines += [
            "",
            f"Targets: engine / ideal >= {TARGETS['vs_ideal_c8_min']} at c=8, solo latency <= "
            f"{TARGETS['solo_latency_max']} x one diffusers call. Peak memory: GPU max allocated (diffusers' "
            "pipeline and the engine both loaded), or peak RSS on a CPU.",
            "",
        ]
    if "lora" in doc["parts"]:
        p = doc["parts"]["lora"]
        lines += [
            "## Mixed LoRA (FLUX shape)",
            "",
            f"8 requests over {p['adapters']} adapters of rank {p['rank']}.",
            "",
            "| mode | best req/s | requests per forward |",
            "|---|---|---|",
        ]
        for m, rs in p["runs"].items():
            if rs:
                lines.append(
                    f"| {m} | {max(r['throughput_rps'] for r in rs):.3f} | "
                    f"{statistics.median(r['mean_requests_per_forward'] for r in rs):.1f} |"
                )
        lines += [
            "",
            ", ".join(f"{k}: {_f(v)}" for k, v in p["ratios"].items())
            + f" (targets: vs grouped >= {TARGETS['lora_vs_grouped_min']}, vs base >= "
            f"{TARGETS['lora_vs_base_min']})",
            "",
        ]
    if "step_cache" in doc["parts"]:
        p = doc["parts"]["step_cache"]
        lines += [
            "## Step cache (FLUX shape)",
            "",
            p["note"] + ".",
            "",
            "| method | threshold | reused solo | speed-up solo | reused c=8 | speed-up c=8 |",
            "|---|---|---|---|---|---|",
        ]
        for r in p["rows"]:
            lines.append(
                f"| {r['method']} | {r['threshold']} | {_f(r.get('c1_reused_fraction'), '.2f')} | "
                f"{_f(r.get('speedup_solo'))} | {_f(r.get('c8_reused_fraction'), '.2f')} | "
                f"{_f(r.get('speedup_c8'))} |"
            )
        lines.append("")
    if "offload" in doc["parts"]:
        p = doc["parts"]["offload"]
        lines += [
            "## Offload (Qwen-Image shape, one solo request)",
            "",
            "| offload | time (s) | GPU peak above start (MiB) | MiB saved per s lost |",
            "|---|---|---|---|",
        ]
        for r in p["rows"]:
            lines.append(
                f"| {r['offload']} | {_f(r.get('time_s'))} | {_f(r.get('gpu_peak_above_start_mib'), '.0f')} "
                f"| {_f(r.get('mib_saved_per_s_lost'), '.0f')}{' ' + r['error'] if 'error' in r else ''} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _f(v: Any, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def write(out: Path, doc: dict[str, Any]) -> None:
    (out / "gpu_evidence.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "gpu_evidence.md").write_text(render_md(doc))
