"""TTS under load: bursts of concurrent streaming /v1/audio/speech requests against one `omnistage serve`.

The server is the tiny ``llasa`` fixture (Llama speech LM on vLLM + XCodec2 codec). Each burst sends
``--concurrency`` streaming requests at once (every other one clones a voice from an inline WAV, the
rest are zero-shot), reads every body to its end and records: the status (200 or 503; anything else is
a failure), whether a 503 carries Retry-After, whether a 200 body has the whole audio, time to first
audio byte. The server process tree's RSS (server + vLLM engine-core) is sampled after a warm-up burst
and after the last burst (plus a short settle), and the tree's pids must be the same (no process died
or was replaced). Runs twice: without an admission limit (everything must complete) and with
``--max-pending`` (the excess must get a clean 503 with Retry-After).

Targets: every request completes or gets a clean 503 with Retry-After; no process dies;
RSS after the load within 10% of RSS before it. Results: ``benchmarks/results/tts_load_llasa.{json,md}``.

``--family qwen3_tts`` serves the tiny Qwen3-TTS Base checkpoint instead (every request clones: in
context from the clip + its transcript, or from its x-vector alone, alternately); results
``tts_load_qwen3_tts.{json,md}``. ``--family higgs_audio`` serves the tiny Higgs Audio v2 folder (half the
requests clone from the clip + its transcript); results ``tts_load_higgs_audio.{json,md}``.

    python benchmarks/tts_load.py [--family llasa|qwen3_tts|higgs_audio] [--concurrency 64] [--bursts 3] [--max-pending 24]
        [--frames 24]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from speech_fixtures import declared, stage0_uses_vllm, tiny_folder  # noqa: E402

RESULTS = Path(__file__).parent / "results"
REF_TEXT = "a reference clip, spoken by someone."
DEFAULT = "llasa"  # the tiny fixture served without --family


def clip_url(seconds: float = 1.2, rate: int = 16000) -> str:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    audio = 0.2 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.default_rng(1).standard_normal(t.size)
    buf = io.BytesIO()
    soundfile.write(buf, audio.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def rss_mb(pid: int) -> float:
    return sum(p.memory_info().rss for p in tree(pid)) / 2**20


async def burst(url: str, n: int, frames: int, ref: str, speech: Any) -> list[dict]:
    """``speech``: the pipeline's declared SpeechInfo (how LM tokens make frames, whether it must clone)."""
    code = speech.frames
    tokens = code.lm_tokens(frames)
    body: dict[str, Any] = {
        "input": "good morning, how are you today?",
        "response_format": "pcm",
        "stream": True,
        "temperature": 0,
        "max_tokens": tokens,
    }
    if code.takes_min_tokens:
        body["min_tokens"] = tokens
    else:  # its LM ends where its codes say: the params that make them repeatable keep every reply's length
        body["sampling_params_list"] = [{k: v for k, v in code.repeatable.items() if k != "temperature"}, None]

    def clone(i: int) -> dict:
        if speech.needs_voice:  # no speaker of its own: every request clones, half from the embedding alone
            alone = {"x_vector_only_mode": True} if speech.clones_from_embedding else {"ref_text": REF_TEXT}
            return {"ref_audio": ref, **({"ref_text": REF_TEXT} if i % 2 else alone)}
        return {"ref_audio": ref, "ref_text": REF_TEXT} if i % 2 else {}

    async def one(c: httpx.AsyncClient, i: int) -> dict:
        b = {**body, **clone(i)}
        t0 = time.perf_counter()
        first = None
        size = 0
        async with c.stream("POST", f"{url}/v1/audio/speech", json=b) as r:
            async for chunk in r.aiter_raw():
                if first is None and chunk:
                    first = time.perf_counter() - t0
                size += len(chunk)
            return {
                "status": r.status_code,
                "bytes": size,
                "ttfb_s": first,
                "retry_after": r.headers.get("retry-after"),
                "e2e_s": time.perf_counter() - t0,
            }

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=n)) as c:
        return await asyncio.gather(*(one(c, i) for i in range(n)))


def run_config(model: Path, storage: Path, args: argparse.Namespace, max_pending: int | None) -> dict:
    from omnistage.testing.server import ServeProcess

    extra = ["--max-pending", str(max_pending)] if max_pending else []
    os.environ["OMNISTAGE_SERVER_STORAGE__PATH"] = str(storage)
    storage.mkdir(parents=True, exist_ok=True)
    log = storage / f"server-{max_pending or 'unlimited'}.log"
    pipeline = declared(model)
    speech = pipeline.info.speaks
    vllm = stage0_uses_vllm(pipeline)
    overrides = ["--stage-overrides", '{"0": {"max_model_len": 512, "dtype": "float32"}}'] if vllm else []
    srv = ServeProcess.launch([str(model), "--served-model-name", f"tiny-{args.family}", *extra, *overrides], log)
    ref = clip_url()
    whole = args.frames * speech.frames.samples_per_frame * 2  # PCM16 bytes of a complete reply
    try:
        asyncio.run(burst(srv.url, args.concurrency, args.frames, ref, speech))  # warm-up: first-request costs
        time.sleep(args.settle_s)
        pids = {p.pid for p in tree(srv.proc.pid)}
        before = rss_mb(srv.proc.pid)
        rows, samples = [], []
        for _ in range(args.bursts):
            rows += asyncio.run(burst(srv.url, args.concurrency, args.frames, ref, speech))
            samples.append(rss_mb(srv.proc.pid))
        time.sleep(args.settle_s)
        after = rss_mb(srv.proc.pid)
        alive = srv.proc.poll() is None and {p.pid for p in tree(srv.proc.pid)} == pids
        in_flight = httpx.get(f"{srv.url}/health").json().get("in_flight")
    finally:
        srv.stop()
    ok = [r for r in rows if r["status"] == 200]
    refused = [r for r in rows if r["status"] == 503]
    ttfb = sorted(r["ttfb_s"] for r in ok if r["ttfb_s"] is not None)
    return {
        "every_request_clones": speech.needs_voice,
        "vllm": vllm,
        "max_pending": max_pending,
        "requests": len(rows),
        "ok": len(ok),
        "refused_503": len(refused),
        "other_status": sorted({r["status"] for r in rows} - {200, 503}),
        "ok_complete": sum(r["bytes"] == whole for r in ok),
        "refused_with_retry_after": sum(bool(r["retry_after"]) and int(r["retry_after"]) > 0 for r in refused),
        "ttfb_ms_p50": 1000 * statistics.median(ttfb) if ttfb else None,
        "ttfb_ms_p95": 1000 * ttfb[int(0.95 * (len(ttfb) - 1))] if ttfb else None,
        "e2e_ms_p50": 1000 * statistics.median(r["e2e_s"] for r in ok) if ok else None,
        "rss_mb_before": before,
        "rss_mb_after": after,
        "rss_mb_peak_sampled": max(samples),
        "rss_ratio": after / before,
        "processes_alive_and_same": alive,
        "in_flight_after": in_flight,
    }


def met(r: dict) -> bool:
    return (
        not r["other_status"]
        and r["ok"] + r["refused_503"] == r["requests"]
        and r["ok_complete"] == r["ok"]
        and r["refused_with_retry_after"] == r["refused_503"]
        and r["processes_alive_and_same"]
        and r["rss_ratio"] <= 1.10
        and r["in_flight_after"] == 0
    )


def write(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    family = report.get("family", DEFAULT)
    first = report["runs"][0]
    (RESULTS / f"tts_load_{family}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# TTS under load: bursts of concurrent streaming /v1/audio/speech (tiny {family}, one server)",
        "",
        f"{report['bursts']} bursts of {report['concurrency']} streaming requests ("
        + (
            "all cloning a voice from an inline WAV: half in context, half from its x-vector"
            if first["every_request_clones"]
            else "half cloning a voice from an inline WAV"
        )
        + f"), {report['frames']} codec frames each, after one warm-up burst; RSS of the server process "
        f"tree ({'server + vLLM engine core' if first['vllm'] else 'server'}) after the warm-up vs after the "
        f"last burst + {report['settle_s']} s.",
        "",
        "| --max-pending | requests | 200 (complete) | 503 (with Retry-After) | other | TTFB p50 / p95 ms | "
        "e2e p50 ms | RSS before / after / peak MB | after / before | processes intact | targets |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        ttfb = f"{r['ttfb_ms_p50']:.0f} / {r['ttfb_ms_p95']:.0f}" if r["ttfb_ms_p50"] is not None else "-"
        e2e = f"{r['e2e_ms_p50']:.0f}" if r["e2e_ms_p50"] is not None else "-"
        lines.append(
            f"| {r['max_pending'] or 'none'} | {r['requests']} | {r['ok']} ({r['ok_complete']}) | "
            f"{r['refused_503']} ({r['refused_with_retry_after']}) | {r['other_status'] or 0} | {ttfb} | {e2e} | "
            f"{r['rss_mb_before']:.0f} / {r['rss_mb_after']:.0f} / {r['rss_mb_peak_sampled']:.0f} | "
            f"{r['rss_ratio']:.3f} | {r['processes_alive_and_same']} | {'met' if met(r) else 'MISSED'} |"
        )
    (RESULTS / f"tts_load_{family}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="omnistage-bench-tts-load-"))
    model = tiny_folder(args.family, root, clones=True)
    runs = [run_config(model, root / f"storage-{mp or 0}", args, mp) for mp in (None, args.max_pending)]
    return {
        "family": args.family,
        "concurrency": args.concurrency,
        "bursts": args.bursts,
        "frames": args.frames,
        "settle_s": args.settle_s,
        "runs": runs,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default=DEFAULT, choices=[DEFAULT, "qwen3_tts", "higgs_audio"])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--max-pending", type=int, default=24)
    parser.add_argument(
        "--frames", type=int, default=24, help="codec frames per request (the declared samples_per_frame each)"
    )
    parser.add_argument("--settle-s", type=float, default=2.0)
    write(main(parser.parse_args()))
