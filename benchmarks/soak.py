"""Soak: a long, mixed, bounded stream of requests against `omnistage serve` processes, watching the memory
and file descriptors of every process of each server's tree.

Servers (``--servers``, all three by default), each on the tiny fixtures (benchmarks/soak_mix.py):

- ``image_chat``: the ``prompt_expand`` family: a vLLM LLM stage in front of an SD3 diffusion stage. Images
  (the LLM expands the prompt, the diffusion stage draws it), streamed chats read to ``[DONE]``, streams the
  client drops after two chunks, and a rotating set of invalid requests, each with the 4xx it must get;
- ``speech``: codec_tts (a vLLM LM of codec tokens + the codec decoder): whole WAV answers and streamed PCM,
  each of the exact length asked for, and invalid requests;
- ``video``: Wan: ``/v1/videos/sync`` MP4s and async jobs (create, poll, download, delete), each of the
  frames and size asked for, and invalid requests.

The requests are shuffled and sent from ``--concurrency`` client threads. Every ``--sample-every`` requests
the RSS of each process of each server tree and the tree's open file descriptors are sampled. Targets: every
process's RSS and every tree's fds grow less than 5% between the first and the last quarter of the samples,
and no unexpected answer (anything but what each request must get). Results:
``benchmarks/results/{--out}.{json,md}``.

    python benchmarks/soak.py [--requests 1000] [--concurrency 4] [--servers image_chat,speech,video]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx  # noqa: E402
import psutil  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from soak_mix import MIX, SERVERS, SHARE  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TARGET_GROWTH = 0.05


def plan(servers: list[str], requests: int) -> list[tuple[str, object]]:
    """``requests`` (server, request function) pairs: servers in their SHARE, each server's own MIX cycled."""
    slots = [s for s in servers for _ in range(SHARE[s] if len(servers) > 1 else 1)]
    mixes = {s: itertools.cycle(MIX[s]) for s in servers}
    order = [(s, next(mixes[s])) for s in itertools.islice(itertools.cycle(slots), requests)]
    random.Random(0).shuffle(order)
    return order


# ----------------------------------------------------------------------------------------------- sampling


def label(p: psutil.Process, root: int) -> str:
    """A stable name for a process of a tree: ``server``, or the child's title (vLLM sets one) or what it runs,
    with its pid."""
    if p.pid == root:
        return "server"
    cmd = " ".join(p.cmdline())
    known = [k for k in ("resource_tracker", "spawn_main", "forkserver") if k in cmd]
    title = known[0] if known else p.name() if not p.name().startswith("python") else cmd[-40:]
    return f"{title} [{p.pid}]"


def tree_usage(pid: int) -> dict:
    """RSS (MiB) of each process of the tree rooted at ``pid``, and open fds of all of them."""
    root = psutil.Process(pid)
    procs, fds = {}, 0
    for p in [root, *root.children(recursive=True)]:
        try:
            procs[label(p, pid)] = round(p.memory_info().rss / 2**20, 1)
            fds += p.num_fds()
        except psutil.NoSuchProcess:
            pass
    return {"rss_mib": round(sum(procs.values()), 1), "fds": fds, "procs": procs}


def quarter_growth(values: list[float]) -> float:
    q = max(1, len(values) // 4)
    first, last = statistics.mean(values[:q]), statistics.mean(values[-q:])
    return (last - first) / first


def quarter_slopes(done: list[int], values: list[float]) -> tuple[float, float]:
    """MiB per 1000 requests (least squares) over the first and over the last quarter of the samples: a
    process whose memory is bounded has a last-quarter slope near 0, whatever its warm-up."""
    q = max(2, len(values) // 4)
    fit = [
        statistics.linear_regression(done[part], values[part]).slope * 1000 for part in (slice(0, q), slice(-q, None))
    ]
    return round(fit[0], 2), round(fit[1], 2)


def growth(samples: list[dict], name: str) -> dict:
    trees = [s["servers"][name] for s in samples]
    done = [s["requests"] for s in samples]
    labels = [k for k in trees[0]["procs"] if all(k in t["procs"] for t in trees)]
    return {
        "rss": round(quarter_growth([t["rss_mib"] for t in trees]), 4),
        "fds": round(quarter_growth([t["fds"] for t in trees]), 4),
        "procs": {
            k: {
                "first_mib": trees[0]["procs"][k],
                "last_mib": trees[-1]["procs"][k],
                "growth": round(quarter_growth([t["procs"][k] for t in trees]), 4),
                "slope_mib_per_1000": quarter_slopes(done, [t["procs"][k] for t in trees]),
            }
            for k in labels
        },
        "procs_not_in_every_sample": sorted({k for t in trees for k in t["procs"]} - set(labels)),
    }


def run(urls: dict[str, str], pids: dict[str, int], requests: int, concurrency: int, sample_every: int) -> dict:
    order = plan(list(urls), requests)
    counts: Counter = Counter()
    unexpected: list[str] = []
    samples: list[dict] = []
    latency: dict[str, float] = {}
    done = 0
    lock = threading.Lock()
    start = time.monotonic()

    def one(i: int) -> None:
        nonlocal done
        server, fn = order[i]
        kind, t0 = fn.__name__, time.monotonic()
        try:
            with httpx.Client(base_url=urls[server], timeout=180) as c:
                kind, ok = fn(c, i)
        except Exception as e:  # noqa: BLE001 - a client-side failure is an unexpected result too
            ok = False
            kind = f"{kind} ({type(e).__name__}: {e})"
        with lock:
            counts[(kind, ok)] += 1
            latency[kind] = max(latency.get(kind, 0.0), time.monotonic() - t0)
            if not ok:
                unexpected.append(f"#{i} {kind}")
            done += 1
            if done % sample_every == 0:
                samples.append(
                    {
                        "requests": done,
                        "t_s": round(time.monotonic() - start, 2),
                        "servers": {name: tree_usage(pid) for name, pid in pids.items()},
                    }
                )
                print(
                    f"{done:6d} requests  {samples[-1]['t_s']:8.1f} s  "
                    + "  ".join(
                        f"{n} {t['rss_mib']:7.1f} MiB {t['fds']} fds" for n, t in samples[-1]["servers"].items()
                    ),
                    f" unexpected {len(unexpected)}",
                    flush=True,
                )

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(requests)))
    health = {name: httpx.get(f"{url}/health", timeout=30).json() for name, url in urls.items()}
    return {
        "requests": requests,
        "concurrency": concurrency,
        "servers": list(urls),
        "sample_every": sample_every,
        "duration_s": round(time.monotonic() - start, 1),
        "by_kind": {f"{k} {'ok' if ok else 'UNEXPECTED'}": n for (k, ok), n in sorted(counts.items())},
        "max_latency_s": {k: round(v, 2) for k, v in sorted(latency.items())},
        "unexpected": unexpected,
        "growth": {name: growth(samples, name) for name in urls},
        "health_after": {n: h["status"] for n, h in health.items()},
        "in_flight_after": {n: h["in_flight"] for n, h in health.items()},
        "samples": samples,
    }


# ----------------------------------------------------------------------------------------------- report


def verdict(result: dict) -> bool:
    grown = [
        g for tree in result["growth"].values() for g in [tree["fds"], *(p["growth"] for p in tree["procs"].values())]
    ]
    return (
        not result["unexpected"]
        and max(grown) < TARGET_GROWTH
        and set(result["health_after"].values()) == {"ok"}
        and not any(result["in_flight_after"].values())
    )


def report(result: dict, notes: str = "") -> str:
    names = ", ".join(result["servers"])
    lines = [
        f"# Soak: {result['requests']} mixed requests, {result['concurrency']} client threads, "
        f"{len(result['servers'])} server(s): {names}",
        "",
        (
            f"`python benchmarks/soak.py --requests {result['requests']} --concurrency {result['concurrency']} "
            f"--servers {','.join(result['servers'])}` — one `omnistage serve` process per server on the tiny "
            "fixtures (benchmarks/soak_mix.py: image_chat = prompt_expand, vLLM LLM stage + SD3 diffusion stage; "
            "speech = codec_tts; video = Wan); RSS of every process of each server tree and the tree's open fds "
            f"sampled every {result['sample_every']} requests. The machine (2 cores) was shared with other "
            "jobs while this ran: durations and latencies are loaded ones."
        ),
        "",
        f"- duration: {result['duration_s']} s",
        f"- unexpected answers: **{len(result['unexpected'])}**"
        + (f" ({', '.join(result['unexpected'][:10])})" if result["unexpected"] else ""),
        f"- /health afterwards: {result['health_after']}, in flight {result['in_flight_after']}",
        f"- verdict (every process's RSS and every tree's fds < {TARGET_GROWTH:.0%} growth, last quarter vs "
        f"first quarter of the samples; 0 unexpected): **{'PASS' if verdict(result) else 'FAIL'}**",
        "",
    ]
    if notes:
        lines += [notes, ""]
    lines += [
        "| server | process | RSS first sample (MiB) | RSS last sample (MiB) | growth, last vs first quarter "
        "| MiB per 1000 requests: first quarter → last quarter |",
        "|---|---|---|---|---|---|",
    ]
    for name, tree in result["growth"].items():
        for proc, g in tree["procs"].items():
            first, last = g["slope_mib_per_1000"]
            lines.append(
                f"| {name} | {proc} | {g['first_mib']} | {g['last_mib']} | **{g['growth']:+.1%}** "
                f"| {first:+.1f} → {last:+.1f} |"
            )
        lines.append(f"| {name} | whole tree: RSS / open fds | | | **{tree['rss']:+.1%}** / **{tree['fds']:+.1%}** | |")
    lines += ["", "| requests by kind | count | max latency (s) |", "|---|---|---|"]
    lines += [
        f"| {k} | {n} | {result['max_latency_s'].get(k.rsplit(' ', 1)[0], '')} |" for k, n in result["by_kind"].items()
    ]
    lines += [
        "",
        "| requests done | time (s) | " + " | ".join(f"{n} RSS (MiB) | {n} fds" for n in result["servers"]) + " |",
        "|---|---|" + "---|---|" * len(result["servers"]),
    ]
    step = max(1, len(result["samples"]) // 40)  # the table keeps about 40 rows; the json has them all
    rows = result["samples"][::step]
    for s in rows + ([result["samples"][-1]] if rows[-1] is not result["samples"][-1] else []):
        lines.append(
            f"| {s['requests']} | {s['t_s']} | "
            + " | ".join(f"{s['servers'][n]['rss_mib']} | {s['servers'][n]['fds']}" for n in result["servers"])
            + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--sample-every", type=int, default=25)
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma-separated, of " + ", ".join(SERVERS))
    ap.add_argument("--out", default="soak")
    args = ap.parse_args()
    names = [n for n in args.servers.split(",") if n]
    if unknown := set(names) - set(SERVERS):
        ap.error(f"unknown servers {sorted(unknown)}; known: {', '.join(SERVERS)}")
    from omnistage.testing.server import ServeProcess

    with tempfile.TemporaryDirectory(prefix="omnistage-soak-") as tmp:
        work = Path(tmp)
        started: dict[str, ServeProcess] = {}
        try:
            for name in names:
                server = SERVERS[name]
                (work / name).mkdir()
                folder = server.build(work / name)
                os.environ["OMNISTAGE_SERVER_STORAGE__PATH"] = str(work / name / "storage")
                started[name] = ServeProcess.launch(
                    [str(folder), *server.args], work / f"{name}.log", ready_timeout=600
                )
                print(f"{name} up at {started[name].url}", flush=True)
            result = run(
                {n: s.url for n, s in started.items()},
                {n: s.proc.pid for n, s in started.items()},
                args.requests,
                args.concurrency,
                args.sample_every,
            )
        finally:
            for server in started.values():
                server.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    (RESULTS / f"{args.out}.md").write_text(text)
    print(text)
    return 0 if verdict(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())
