"""Soak: a long, mixed, bounded stream of requests against one `omnistage serve` process, watching its memory
and file descriptors.

The server is the ``prompt_expand`` family on the tiny fixtures: a vLLM LLM stage (its own engine-core
process) in front of a diffusion stage, so both engine kinds carry load. The request mix, from several
client threads at once:

- image: POST /v1/images/generations (the LLM expands the prompt, the diffusion stage draws it) -> 200
- chat stream: streamed chat with ``modalities: ["text"]`` (the LLM stage only), read to ``[DONE]`` -> 200
- aborted stream: a streamed chat the client closes after two chunks (the server must abort it everywhere)
- bad input: a rotating set of invalid requests, each with the 4xx it must get (oversize, undivisible size,
  bad JSON, unknown model, bad media URL, ...)

Every ``--sample-every`` requests the server process tree's RSS (server + engine-core process) and open
file descriptors are sampled. Targets: growth under 10% between the first and the last quarter of the
samples, and no unexpected answer (anything but the status each request must get). Results:
``benchmarks/results/soak.{json,md}``.

    python benchmarks/soak.py [--requests 1000] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx
import psutil

RESULTS = Path(__file__).parent / "results"
TARGET_GROWTH = 0.10
PROMPTS = ["a red cat on a blue chair", "a lighthouse at dusk", "two green apples", "a paper boat", "snowy hills"]


def build_server_folder(work: Path) -> Path:
    """A prompt_expand folder over the tiny chat LM and the tiny SD3 image model."""
    from omnistage.testing.tiny import build

    folder = work / "expander"
    folder.mkdir()
    build("chat", work / "chat")
    build("sd3", work / "sd3")
    (folder / "llm").symlink_to(work / "chat")
    (folder / "image").symlink_to(work / "sd3")
    (folder / "omnistage.json").write_text(json.dumps({"pipeline": "prompt_expand"}))
    return folder


# ----------------------------------------------------------------------------------------------- the mix


def image(c: httpx.Client, i: int) -> tuple[str, bool]:
    r = c.post("/v1/images/generations", json={"prompt": PROMPTS[i % len(PROMPTS)], "size": "32x32", "seed": i,
                                                "num_inference_steps": 2, "max_tokens": 12, "ignore_eos": True})
    return "image", r.status_code == 200 and len(r.json()["data"]) == 1


def chat_stream(c: httpx.Client, i: int) -> tuple[str, bool]:
    body = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "modalities": ["text"],
            "max_tokens": 24, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    usage = json.loads(lines[-2][6:]).get("usage") if len(lines) >= 2 else None
    return "chat_stream", r.status_code == 200 and lines[-1] == "data: [DONE]" and usage["completion_tokens"] == 24


def aborted_stream(c: httpx.Client, i: int) -> tuple[str, bool]:
    body = {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], "modalities": ["text"],
            "max_tokens": 400, "ignore_eos": True, "stream": True}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        ok = r.status_code == 200
        for n, _ in enumerate(r.iter_lines()):
            if n >= 2:
                break  # leaving the block closes the connection mid-stream
    return "aborted_stream", ok


BAD: list[tuple[str, dict, int]] = [
    ("/v1/images/generations", {"json": {"prompt": "x", "size": "8192x8192"}}, 400),  # --max-image-pixels
    ("/v1/images/generations", {"json": {"prompt": "x", "size": "30x30"}}, 400),  # not a multiple of the patch
    ("/v1/images/generations", {"json": {"prompt": "x", "num_inference_steps": 500}}, 400),  # --max-inference-steps
    ("/v1/images/generations", {"json": {"prompt": ""}}, 400),
    ("/v1/images/generations", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400),
    ("/v1/images/edits", {"json": {"prompt": "x", "image_url": "data:image/png;base64,@@@"}}, 400),
    ("/v1/images/edits", {"json": {"prompt": "x", "image_url": "file:///etc/passwd"}}, 400),
    ("/v1/chat/completions", {"json": {"messages": []}}, 400),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}}, 400),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}}, 404),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}}, 400),
    ("/v1/audio/speech", {"json": {"input": "x"}}, 400),  # this model makes no audio
    ("/v1/videos/video_0000/content", {"method": "GET"}, 404),
]


def bad_input(c: httpx.Client, i: int) -> tuple[str, bool]:
    path, kw, status = BAD[i % len(BAD)]
    kw = dict(kw)
    r = c.request(kw.pop("method", "POST"), path, **kw)
    body = r.json()
    return "bad_input", r.status_code == status and set(body) == {"error"}


MIX = [image] * 6 + [chat_stream] * 6 + [aborted_stream] * 3 + [bad_input] * 5  # 20 slots, shuffled below


# ----------------------------------------------------------------------------------------------- sampling


def tree_usage(pid: int) -> tuple[float, float, int]:
    """RSS in MiB of the server process and of its children (vLLM's engine core), and open file descriptors
    of all of them."""
    root = psutil.Process(pid)
    server, children, fds = root.memory_info().rss, 0, root.num_fds()
    for p in root.children(recursive=True):
        try:
            children += p.memory_info().rss
            fds += p.num_fds()
        except psutil.NoSuchProcess:
            pass
    return server / 2**20, children / 2**20, fds


def quarter_growth(values: list[float]) -> float:
    q = max(1, len(values) // 4)
    first, last = statistics.mean(values[:q]), statistics.mean(values[-q:])
    return (last - first) / first


def run(url: str, pid: int, requests: int, concurrency: int, sample_every: int) -> dict:
    import random

    order = list(itertools.islice(itertools.cycle(MIX), requests))
    random.Random(0).shuffle(order)
    counts: Counter = Counter()
    unexpected: list[str] = []
    samples: list[dict] = []
    done = 0
    lock = threading.Lock()
    start = time.monotonic()

    def one(i: int) -> None:
        nonlocal done
        kind = order[i].__name__
        try:
            with httpx.Client(base_url=url, timeout=120) as c:
                kind, ok = order[i](c, i)
        except Exception as e:  # noqa: BLE001 - a client-side failure is an unexpected result too
            ok = False
            kind = f"{kind} ({type(e).__name__}: {e})"
        with lock:
            counts[(kind, ok)] += 1
            if not ok:
                unexpected.append(f"#{i} {kind}")
            done += 1
            if done % sample_every == 0:
                server, children, fds = tree_usage(pid)
                samples.append({"requests": done, "t_s": round(time.monotonic() - start, 2),
                                "rss_mib": round(server + children, 1), "server_rss_mib": round(server, 1),
                                "children_rss_mib": round(children, 1), "fds": fds})
                print(f"{done:5d} requests  {samples[-1]['t_s']:7.1f} s  RSS {server:7.1f} + {children:7.1f} MiB  "
                      f"fds {fds}", flush=True)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(requests)))
    health = httpx.get(f"{url}/health", timeout=30).json()
    rss = [s["rss_mib"] for s in samples]
    fds = [s["fds"] for s in samples]
    return {
        "requests": requests, "concurrency": concurrency, "duration_s": round(time.monotonic() - start, 1),
        "by_kind": {f"{k} {'ok' if ok else 'UNEXPECTED'}": n for (k, ok), n in sorted(counts.items())},
        "unexpected": unexpected, "rss_growth": round(quarter_growth(rss), 4), "fd_growth": round(quarter_growth(fds), 4),
        "health_after": health["status"], "in_flight_after": health["in_flight"], "samples": samples,
    }


def report(result: dict) -> str:
    ok = (not result["unexpected"] and result["rss_growth"] < TARGET_GROWTH and result["fd_growth"] < TARGET_GROWTH
          and result["health_after"] == "ok")
    lines = [f"# Soak: {result['requests']} mixed requests, {result['concurrency']} client threads, one server",
             "",
             ("`python benchmarks/soak.py` — `omnistage serve` of the prompt_expand family on the tiny fixtures "
              "(vLLM LLM stage + SD3 diffusion stage), RSS and open fds of the server process tree sampled every "
              f"{result['samples'][1]['requests'] - result['samples'][0]['requests']} requests."),
             "",
             f"- duration: {result['duration_s']} s",
             (f"- RSS growth, last quarter vs first quarter of samples: **{result['rss_growth']:+.1%}** "
              f"(target < {TARGET_GROWTH:.0%})"),
             f"- open fd growth: **{result['fd_growth']:+.1%}** (target < {TARGET_GROWTH:.0%})",
             f"- unexpected answers: **{len(result['unexpected'])}**",
             f"- /health afterwards: {result['health_after']}, {result['in_flight_after']} in flight",
             f"- verdict: **{'PASS' if ok else 'FAIL'}**",
             "", "| requests by kind | count |", "|---|---|"]
    lines += [f"| {k} | {n} |" for k, n in result["by_kind"].items()]
    lines += ["", "| requests done | time (s) | RSS (MiB) | of it: server process | of it: engine core | open fds |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {s['requests']} | {s['t_s']} | {s['rss_mib']} | {s['server_rss_mib']} | {s['children_rss_mib']} "
              f"| {s['fds']} |" for s in result["samples"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--sample-every", type=int, default=25)
    ap.add_argument("--out", default="soak")
    args = ap.parse_args()
    from omnistage.testing.server import ServeProcess

    with tempfile.TemporaryDirectory(prefix="omnistage-soak-") as tmp:
        work = Path(tmp)
        folder = build_server_folder(work)
        os.environ["OMNISTAGE_SERVER_STORAGE__PATH"] = str(work / "storage")
        server = ServeProcess.launch([str(folder), "--enforce-eager", "--served-model-name", "soak"],
                                     work / "server.log", ready_timeout=600)
        try:
            result = run(server.url, server.proc.pid, args.requests, args.concurrency, args.sample_every)
        finally:
            server.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    (RESULTS / f"{args.out}.md").write_text(text)
    print(text)
    return 0 if "**PASS**" in text else 1


if __name__ == "__main__":
    raise SystemExit(main())
