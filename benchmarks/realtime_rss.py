"""Server memory over many short /v1/realtime sessions: the RSS of a running server's process tree (psutil)
sampled as N sessions (one spoken turn each, streamed in real time) come and go, after a warm-up.

    omnistage serve <model> --port 8767 &
    python benchmarks/realtime_rss.py --base-url http://127.0.0.1:8767 --pid <server pid> \\
        --session '{"max_output_tokens": 4}' --output benchmarks/results/realtime_rss

Reports RSS after the warm-up, after each batch and at the end, and the growth between the first and the
last quarter of the batches (a session kept alive by mistake would hold its audio, conversation and task).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import psutil

from omnistage.bench.realtime import RealtimeConfig, Session
from omnistage.bench.utterance import utterance


def tree_rss(pid: int) -> tuple[int, int]:
    """The RSS of the server process and of it with its children (vLLM engine cores)."""
    proc = psutil.Process(pid)
    own = proc.memory_info().rss
    return own, own + sum(p.memory_info().rss for p in proc.children(recursive=True) if p.is_running())


async def batch(cfg: RealtimeConfig, n: int) -> int:
    results = await asyncio.gather(*(Session(cfg).run() for _ in range(n)), return_exceptions=True)
    return sum(1 for r in results if not isinstance(r, BaseException) and r[0].status in ("completed", "incomplete"))


async def main(args: argparse.Namespace) -> dict:
    clip, _ = utterance(args.speech_seconds, 16000, after_s=0.1)
    url = args.base_url.replace("http://", "ws://").rstrip("/") + "/v1/realtime"
    cfg = RealtimeConfig(
        url=url, clip=clip, rate=16000, api_key=args.api_key, turns=1, barge_in=False, session=json.loads(args.session)
    )
    await batch(cfg, args.concurrency)  # warm-up: thread pools, allocator arenas, caches
    for _ in range(args.warmup // args.concurrency - 1):
        await batch(cfg, args.concurrency)
    samples = [(0, tree_rss(args.pid))]
    answered, start = 0, time.perf_counter()
    while samples[-1][0] < args.sessions:
        answered += await batch(cfg, args.concurrency)
        samples.append((samples[-1][0] + args.concurrency, tree_rss(args.pid)))
    q = max(1, len(samples) // 4)
    first = sum(r[1] for _, r in samples[:q]) / q
    last = sum(r[1] for _, r in samples[-q:]) / q
    (_, (own0, all0)), (_, (own1, all1)) = samples[0], samples[-1]
    return {
        "sessions": samples[-1][0],
        "answered": answered,
        "concurrency": args.concurrency,
        "wall_s": time.perf_counter() - start,
        "rss_mib": [(n, own / 2**20, tree / 2**20) for n, (own, tree) in samples],
        "rss_start_mib": all0 / 2**20,
        "rss_end_mib": all1 / 2**20,
        "server_rss_start_mib": own0 / 2**20,
        "server_rss_end_mib": own1 / 2**20,
        "growth_first_to_last_quarter": last / first - 1,
        "growth_start_to_end": all1 / all0 - 1,
        "server_growth_start_to_end": own1 / own0 - 1,
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--pid", type=int, required=True, help="the server's process id (its children are counted too)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--sessions", type=int, default=200)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--speech-seconds", type=float, default=0.5)
    p.add_argument("--session", default="{}", help="session.update fields (JSON)")
    p.add_argument("--label", default="realtime sessions")
    p.add_argument("--output", default=None, help="path stem: writes .json and .md")
    args = p.parse_args()
    result = asyncio.run(main(args))
    md = (
        f"# Server RSS over {result['sessions']} short /v1/realtime sessions ({args.label})\n\n"
        f"{result['answered']}/{result['sessions']} answered, {result['concurrency']} at a time, "
        f"{result['wall_s']:.0f} s. RSS of the server's process tree after a {args.warmup}-session warm-up: "
        f"{result['rss_start_mib']:.0f} MiB, at the end {result['rss_end_mib']:.0f} MiB "
        f"(**{result['growth_start_to_end'] * 100:+.1f} %**; first quarter of the samples -> last quarter "
        f"{result['growth_first_to_last_quarter'] * 100:+.1f} %); the server process alone "
        f"{result['server_rss_start_mib']:.0f} -> {result['server_rss_end_mib']:.0f} MiB "
        f"({result['server_growth_start_to_end'] * 100:+.1f} %).\n\n"
        "| sessions | server process MiB | with its children MiB |\n|---|---|---|\n"
        + "".join(f"| {n} | {own:.0f} | {tree:.0f} |\n" for n, own, tree in result["rss_mib"])
    )
    print(md)
    if args.output:
        Path(args.output).with_suffix(".json").write_text(json.dumps({"config": vars(args), **result}, indent=2))
        Path(args.output).with_suffix(".md").write_text(md)
