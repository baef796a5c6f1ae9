"""Speech recognition serving: ``omnistage bench serve --task asr``'s client against omnistage and against the
same Whisper folder behind plain ``vllm serve``, in one script.

Both servers run as users start them (child processes, vLLM's engine core in its own process on both sides,
the same engine args), both stay up, and each concurrency level runs on both in alternating order, ``--rounds``
times, so load from elsewhere on the machine hits both alike. The same seeded clips (``--audio-s`` seconds),
the same greedy decode and token budget (``max_completion_tokens``), and every answer's text is compared
between the servers. Reported per concurrency: throughput (requests/s), mean / p50 / p99 latency and the RTF
(latency / seconds heard) on each side, and the ratios omnistage / vLLM (targets: throughput >= 0.95x, mean
latency <= 1.05x). Results: ``benchmarks/results/asr_serve.{json,md}``.

    python benchmarks/asr_serve.py [--model WHISPER_DIR] [--concurrency 1,2,4,8,16] [--rounds 2]

Without ``--model`` the tiny Whisper fixture is built (random weights: its per-token compute is tiny, so this is
the worst case for omnistage's relative overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx

from omnistage.bench.datasets import DatasetDefaults, random_dataset
from omnistage.bench.metrics import aggregate
from omnistage.bench.request_funcs import ClientSpec
from omnistage.bench.runner import RunConfig, run_benchmark
from omnistage.testing.server import free_port

RESULTS = Path(__file__).parent / "results"
MODEL = "asr-bench"
KV_BYTES = 64 << 20
MAX_MODEL_LEN = 448
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1"}


def start(kind: str, folder: Path, max_num_seqs: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if kind == "vllm":
        args = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(folder),
            "--served-model-name",
            MODEL,
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--kv-cache-memory-bytes",
            str(KV_BYTES),
            "--enforce-eager",
            "--max-num-seqs",
            str(max_num_seqs),
        ]
    else:
        overrides = {
            "0": {
                "engine_args": {"dtype": "float32", "max_model_len": MAX_MODEL_LEN, "kv_cache_memory_bytes": KV_BYTES}
            }
        }
        args = [
            sys.executable,
            "-m",
            "omnistage.cli.main",
            "serve",
            str(folder),
            "--served-model-name",
            MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--enforce-eager",
            "--max-num-seqs",
            str(max_num_seqs),
            "--stage-overrides",
            json.dumps(overrides),
        ]
    proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=ENV)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{kind} not up in time:\n{log.read_text()[-3000:]}")
        time.sleep(1)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


async def one_run(url: str, requests, concurrency: int, max_tokens: int) -> tuple[dict, list[str]]:
    for r in requests:
        r.extra = {"language": "en", "max_completion_tokens": max_tokens}
    spec = ClientSpec(base_url=url, task="asr", model=MODEL, temperature=0.0)
    cfg = RunConfig(max_concurrency=concurrency, warmup_requests=1, slo_scale=0, progress=False)
    run = await run_benchmark(spec, requests, cfg)
    results = [o.result for o in run.outcomes]
    texts = [o.outputs[0][1].decode() if o.outputs else "" for o in run.outcomes]
    return aggregate(results, run.duration), texts


def summarize(runs: list[dict]) -> dict:
    keys = ("throughput_qps", "latency_mean", "latency_p50", "latency_p99", "audio_rtf_mean")
    out = {
        k: statistics.median(r[k] for r in runs if r.get(k) is not None)
        for k in keys
        if any(r.get(k) is not None for r in runs)
    }
    out["failed_requests"] = sum(r["failed_requests"] for r in runs)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="a Whisper folder (default: build the tiny fixture)")
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests-per-level", type=int, default=32, help="requests per run, at least the concurrency")
    p.add_argument("--audio-s", type=float, default=5.0)
    p.add_argument("--max-tokens", type=int, default=24)
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="asr-bench-"))
    folder = args.model
    if folder is None:
        from omnistage.testing.tiny import build

        folder = build("whisper", tmp / "whisper")
    procs = {}
    try:
        for kind in ("vllm", "omnistage"):
            procs[kind] = start(kind, folder, max(levels), tmp / f"{kind}.log")
        runs: dict[str, dict[int, list[dict]]] = {k: {c: [] for c in levels} for k in procs}
        mismatched = 0
        for rnd in range(args.rounds):
            for c in levels:
                n = max(args.requests_per_level, c)
                texts = {}
                order = ("vllm", "omnistage") if rnd % 2 == 0 else ("omnistage", "vllm")
                for kind in order:
                    reqs = random_dataset("asr", n, DatasetDefaults(seed=rnd * 1000, chat_audio_s=args.audio_s))
                    m, texts[kind] = asyncio.run(one_run(procs[kind][1], reqs, c, args.max_tokens))
                    runs[kind][c].append(m)
                    print(
                        f"round {rnd} c={c} {kind}: {m['throughput_qps']:.2f} req/s, "
                        f"mean {m['latency_mean']:.3f} s, failed {m['failed_requests']}",
                        flush=True,
                    )
                mismatched += sum(a != b for a, b in zip(texts["vllm"], texts["omnistage"]))
    finally:
        for proc, _ in procs.values():
            stop(proc)
    rows = []
    for c in levels:
        v, o = summarize(runs["vllm"][c]), summarize(runs["omnistage"][c])
        rows.append(
            {
                "concurrency": c,
                "vllm": v,
                "omnistage": o,
                "throughput_ratio": o["throughput_qps"] / v["throughput_qps"],
                "mean_latency_ratio": o["latency_mean"] / v["latency_mean"],
            }
        )
    report = {
        "model": str(args.model or "tiny whisper fixture (random weights)"),
        "audio_s": args.audio_s,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "requests_per_level": args.requests_per_level,
        "texts_differing": mismatched,
        "load_before": os.getloadavg(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    write(report)
    return 0 if mismatched == 0 else 1


def write(report: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "asr_serve.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# ASR serving: omnistage vs plain `vllm serve` (`/v1/audio/transcriptions`)",
        "",
        f"`python benchmarks/asr_serve.py` — {report['model']}, {report['audio_s']} s seeded clips, greedy, "
        f"{report['max_tokens']} tokens, {report['requests_per_level']} requests per run, median of "
        f"{report['rounds']} alternating rounds; {report['cpus']} CPUs (1-minute load average at the end, this "
        f"benchmark's own servers and clients included: {report['load_before'][0]:.1f}). Answers differing "
        f"between the servers: "
        f"{report['texts_differing']}.",
        "",
        "| c | vLLM req/s | omnistage req/s | throughput ratio | vLLM mean s | omnistage mean s | "
        "mean latency ratio | omnistage p99 s | omnistage RTF |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        v, o = r["vllm"], r["omnistage"]
        lines.append(
            f"| {r['concurrency']} | {v['throughput_qps']:.2f} | {o['throughput_qps']:.2f} | "
            f"{r['throughput_ratio']:.2f}x | {v['latency_mean']:.3f} | {o['latency_mean']:.3f} | "
            f"{r['mean_latency_ratio']:.2f}x | {o['latency_p99']:.3f} | {o.get('audio_rtf_mean', 0):.3f} |"
        )
    (RESULTS / "asr_serve.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
