"""What sharing the job store costs, and two front-ends against one under the same load (docs/fleet.md).

- ``store_ops``: microseconds per job-store call (put, conditional update, get, lease renewal, claim of an expired
  job) on SQLite and on a local Redis server.
- ``read_overhead``: ``GET /v1/videos/{id}`` (a job-store read) against ``GET /health`` (none) on the same server:
  medians, alternated; the ratio is the store's share of a poll.
- ``front_ends``: the same load (``--jobs`` video jobs, ``--clients`` at a time, each made on one front-end and
  polled on the other) on one front-end and on two sharing the store: jobs per second and p50 / p99 from the POST
  to the poll that saw it completed. The front-ends run the test pipeline (tests/server/pipelines.py: a few ms of
  model work per job) in this process, so they share one interpreter: this measures the coordination through the
  store, not a second machine's GPU.

    python benchmarks/fleet.py [--jobs 60] [--clients 6] [--runs 200]

Needs ``redis-server`` on PATH (scripts/install-redis.sh); results in benchmarks/results/fleet.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # the test pipeline and the Redis helper live in tests/

VIDEO = {"prompt": "a cat", "size": "16x16", "num_frames": 3, "seed": 1}


def store_ops(url: str, runs: int) -> dict:
    from omnistage.server.jobstore import job_store

    async def main() -> dict:
        store = job_store(url)
        await store.open()
        times: dict[str, list[float]] = {k: [] for k in ("put", "update", "get", "renew", "claim")}

        async def timed(name: str, coro) -> None:
            t0 = time.perf_counter()
            await coro
            times[name].append(time.perf_counter() - t0)

        for i in range(runs):
            job_id, record = f"bench_{i}", {"id": f"bench_{i}", "model": "m", "status": "queued"}
            await timed("put", store.put("bench", job_id, "queued", i, record, owner="A", lease_until=time.time() - 1))
            await timed("update", store.update(job_id, "A", "in_progress", record))
            await timed("get", store.get(job_id))
            await timed("renew", store.renew("A", [job_id], time.time() - 1))
            await timed("claim", store.claim(job_id, "B", time.time(), time.time() + 30))
            await store.delete(job_id)
        await store.close()
        return {k: round(statistics.median(v) * 1e6, 1) for k, v in times.items()}

    return asyncio.run(main())


def front_ends(url: str, folder: Path, n: int):
    from omnistage.config.settings import ServerSettings
    from omnistage.testing.server import serve_engine
    from tests.server.conftest import new_engine
    from tests.server.pipelines import GATE, omni_pipeline

    GATE.set()
    settings = ServerSettings(storage={"path": str(folder)}, job_store=url)
    return [serve_engine(new_engine(omni_pipeline()), settings, served_model_name="omni") for _ in range(n)]


def read_overhead(server, runs: int) -> dict:
    with server.client() as c:
        job = c.post("/v1/videos", json=VIDEO).json()
        poll, health = [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            assert c.get(f"/v1/videos/{job['id']}").status_code == 200
            poll.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert c.get("/health").status_code == 200
            health.append(time.perf_counter() - t0)
    p, h = statistics.median(poll), statistics.median(health)
    return {"poll_ms": round(p * 1e3, 2), "health_ms": round(h * 1e3, 2), "ratio": round(p / h, 2)}


def load(servers, jobs: int, clients: int) -> dict:
    def one(i: int) -> float:
        maker, poller = servers[i % len(servers)], servers[(i + 1) % len(servers)]
        t0 = time.perf_counter()
        job = httpx.post(f"{maker.url}/v1/videos", json={**VIDEO, "seed": i}, timeout=60).json()
        while httpx.get(f"{poller.url}/v1/videos/{job['id']}", timeout=60).json()["status"] != "completed":
            time.sleep(0.02)
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latencies = sorted(pool.map(one, range(jobs)))
    wall = time.perf_counter() - t0
    return {
        "jobs_per_s": round(jobs / wall, 2),
        "p50_s": round(latencies[len(latencies) // 2], 3),
        "p99_s": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    from tests.server.fleet.stores import REDIS, RedisServer

    if REDIS is None:
        sys.exit("needs redis-server on PATH (scripts/install-redis.sh)")
    out: dict = {"machine": platform.platform(), "args": vars(args), "store_ops_us": {}, "read": {}, "load": {}}
    with tempfile.TemporaryDirectory() as tmp:
        redis_server = RedisServer(Path(tmp)).start()
        try:
            urls = {"sqlite": f"sqlite:///{tmp}/jobs.db", "redis": redis_server.url}
            for name, url in urls.items():
                out["store_ops_us"][name] = store_ops(url, args.runs)
                servers = front_ends(url, Path(tmp) / f"media-{name}", 2)
                try:
                    out["read"][name] = read_overhead(servers[0], args.runs)
                    out["load"][name] = {
                        "one_front_end": load(servers[:1], args.jobs, args.clients),
                        "two_front_ends": load(servers, args.jobs, args.clients),
                    }
                finally:
                    for s in servers:
                        s.stop()
        finally:
            redis_server.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fleet.json").write_text(json.dumps(out, indent=2) + "\n")
    (RESULTS / "fleet.md").write_text(report(out))
    print(report(out))


def report(out: dict) -> str:
    lines = [
        "# Fleet: job-store cost and two front-ends against one",
        "",
        f"`python benchmarks/fleet.py` ({out['args']}) on {out['machine']}. The front-ends share one interpreter",
        "(the test pipeline, in this process): the load rows compare the coordination through the store, not a",
        "second machine's compute.",
        "",
        "| store | put µs | update µs | get µs | renew µs | claim µs | poll ms | /health ms | poll / health |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, ops in out["store_ops_us"].items():
        r = out["read"][name]
        cells = [ops[k] for k in ("put", "update", "get", "renew", "claim")]
        lines.append(
            f"| {name} | " + " | ".join(map(str, cells)) + f" | {r['poll_ms']} | {r['health_ms']} | {r['ratio']} |"
        )
    lines += ["", "| store | front-ends | jobs/s | p50 s | p99 s |", "|---|---|---|---|---|"]
    for name, rows in out["load"].items():
        for label, r in rows.items():
            lines.append(f"| {name} | {label.split('_')[0]} | {r['jobs_per_s']} | {r['p50_s']} | {r['p99_s']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
