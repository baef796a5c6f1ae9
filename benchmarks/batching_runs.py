"""The three ways ``diffusion_batching.py`` runs a list of requests, and what it measures of each run:
diffusers once per request (sequential), diffusers once per batch of ``c`` (the ideal static batch), and
omnistage's engine with at most ``c`` requests in flight; plus the budget that skips runs which would overrun.
Also used by gpu_evidence.py, lora_mixed.py and diffusion_parallel.py."""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import threading
import time
from typing import Any

import torch


class Clock:
    """Wall time, process CPU time and peak memory of one run: GPU max-allocated on CUDA (reset per run),
    else peak RSS (sampled)."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self) -> Clock:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_mem = torch.cuda.memory_allocated(self.device) / 2**20
        else:
            self.start_mem, self._stop = 0.0, threading.Event()
            self._peak = 0.0
            self._t = threading.Thread(target=self._sample_rss, daemon=True)
            self._t.start()
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def _sample_rss(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            with open("/proc/self/statm") as f:
                self._peak = max(self._peak, int(f.read().split()[1]) * page / 2**20)
            self._stop.wait(0.005)

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.duration, self.cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            self._stop.set()
            self._t.join()
            self.peak = self._peak


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


def summary(mode: str, c: int, clock: Clock, latencies: list[float]) -> dict[str, Any]:
    mem = "gpu_peak_alloc_mib" if clock.device.type == "cuda" else "peak_rss_mib"
    out = {
        "mode": mode,
        "concurrency": c,
        "duration_s": clock.duration,
        "throughput_rps": len(latencies) / clock.duration,
        "cpu_s": clock.cpu,
        "requests_per_cpu_s": len(latencies) / max(clock.cpu, 1e-9),
        "latency_p50_s": statistics.median(latencies),
        "latency_p99_s": pct(latencies, 99),
        mem: clock.peak,
    }
    if clock.device.type == "cuda":
        out["gpu_peak_above_start_mib"] = clock.peak - clock.start_mem
    return out


def call_kw(r: dict[str, Any]) -> dict[str, Any]:
    """A request's diffusers ``__call__`` keywords: everything but the prompt and the seed (a generator there),
    the model-specific ``extra_args`` flattened (the engine takes them nested)."""
    return {**{k: v for k, v in r.items() if k not in ("prompt", "seed", "extra_args")}, **r.get("extra_args", {})}


def run_sequential(pipe: Any, reqs: list[dict], device: torch.device) -> dict[str, Any]:
    lat = []
    with Clock(device) as clock:
        for r in reqs:
            s = time.perf_counter()
            pipe(
                prompt=r["prompt"], generator=torch.Generator().manual_seed(r["seed"]), **call_kw(r)
            )  # PIL: synchronises
            lat.append(time.perf_counter() - s)
    return summary("diffusers_sequential", 1, clock, lat)


def run_batched(pipe: Any, reqs: list[dict], c: int, device: torch.device) -> dict[str, Any]:
    lat = []
    with Clock(device) as clock:
        for i in range(0, len(reqs), c):
            chunk = reqs[i : i + c]
            s = time.perf_counter()
            kw = call_kw(chunk[0])
            if "image" in kw:  # each request's own input image
                kw["image"] = [r["image"] for r in chunk]
            pipe(
                prompt=[r["prompt"] for r in chunk],
                generator=[torch.Generator().manual_seed(r["seed"]) for r in chunk],
                **kw,
            )
            lat.extend([time.perf_counter() - s] * len(chunk))  # a static batch finishes together
    return summary("diffusers_batched_ideal", c, clock, lat)


_ids = itertools.count()


async def run_engine(omni: Any, reqs: list[dict], c: int, device: torch.device) -> dict[str, Any]:
    sem = asyncio.Semaphore(c)
    lat: list[float] = []
    # requests in the busiest stage's batch (the one stage, or of a pipeline's stages), sampled at every step
    # output of every request
    running: list[int] = []

    async def one(r: dict) -> None:
        async with sem:
            s = time.perf_counter()
            params = {k: v for k, v in r.items() if k not in ("prompt", "image")}
            # an input image (diffusers' ``image=``) goes with the prompt, as the engine takes media
            prompt = (
                {"prompt": r["prompt"], "multi_modal_data": {"image": [r["image"]]}} if "image" in r else r["prompt"]
            )
            rid = f"bench-{next(_ids)}"
            async for out in omni.generate(prompt, request_id=rid, sampling_params_list=[params]):
                if out.error is not None:
                    raise RuntimeError(f"engine request failed: {out.error}")
                if not out.finished:
                    running.append(max(st.running for st in omni.stage_stats().values()))
            lat.append(time.perf_counter() - s)

    with Clock(device) as clock:
        await asyncio.gather(*(one(r) for r in reqs))
    res = summary("engine", c, clock, lat)
    res["mean_running_requests"] = sum(running) / len(running) if running else None
    return res


class Budget:
    """Skip a run when its estimated duration would pass the deadline (time.monotonic())."""

    def __init__(self, deadline: float | None):
        self.deadline = deadline
        self.skipped: list[dict[str, Any]] = []

    def allows(self, estimate_s: float, what: dict[str, Any]) -> bool:
        if self.deadline is None or time.monotonic() + estimate_s <= self.deadline:
            return True
        self.skipped.append(
            {**what, "estimate_s": round(estimate_s, 2), "left_s": round(self.deadline - time.monotonic(), 2)}
        )
        print(f"skipped (budget): {what} needs ~{estimate_s:.1f}s", flush=True)
        return False
