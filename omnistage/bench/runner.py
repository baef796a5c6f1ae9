"""Load generation: warm-up, SLO calibration, Poisson (or all-at-once) arrivals
under a concurrency cap, progress bar."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from dataclasses import dataclass, field

import httpx
from tqdm.asyncio import tqdm

from omnistage.bench.datasets import BenchRequest
from omnistage.bench.request_funcs import ClientSpec, Outcome, send_request

log = logging.getLogger(__name__)
DIFFUSION_TASKS = ("t2i", "i2i", "t2v", "i2v")


@dataclass
class RunConfig:
    request_rate: float = math.inf  # requests/s; inf sends everything at once
    max_concurrency: int | None = None
    warmup_requests: int = 1
    warmup_num_inference_steps: int | None = 2
    slo_s: float | None = None  # explicit SLO; else slo_scale x a solo request's latency
    slo_scale: float = 3.0
    seed: int = 0
    request_timeout_s: float = 600.0
    progress: bool = True


@dataclass
class BenchmarkRun:
    outcomes: list[Outcome]
    duration: float
    slo_s: float | None
    slo_reference_latency: float | None = None  # the solo request the SLO was scaled from
    warmup_errors: list[str] = field(default_factory=list)


def arrival_delays(n: int, rate: float, seed: int) -> list[float]:
    """Gaps between arrivals: exponential (a Poisson process) or all zero for ``inf``."""
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise ValueError("--request-rate must be positive or inf")
    rng = random.Random(seed)
    return [0.0] + [rng.expovariate(rate) for _ in range(n - 1)]


async def run_benchmark(spec: ClientSpec, requests: list[BenchRequest], cfg: RunConfig) -> BenchmarkRun:
    conns = max(cfg.max_concurrency or len(requests), 1) + 2
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        warmup_errors = await _warmup(client, spec, requests, cfg)
        slo_s, slo_ref = cfg.slo_s, None
        if slo_s is None and cfg.slo_scale and cfg.slo_scale > 0:
            solo = await send_request(client, spec, requests[0])
            if solo.result.success:
                slo_ref = solo.result.latency
                slo_s = cfg.slo_scale * slo_ref
            else:
                log.warning("SLO calibration request failed: %s", solo.result.error)
        outcomes, duration = await _main_load(client, spec, requests, cfg)
    return BenchmarkRun(outcomes, duration, slo_s, slo_ref, warmup_errors)


async def _warmup(
    client: httpx.AsyncClient, spec: ClientSpec, requests: list[BenchRequest], cfg: RunConfig
) -> list[str]:
    errors = []
    for i in range(cfg.warmup_requests):
        req = requests[i % len(requests)]
        if spec.task in DIFFUSION_TASKS and cfg.warmup_num_inference_steps:
            req = req.with_steps(cfg.warmup_num_inference_steps)
        out = await send_request(client, spec, req)
        if not out.result.success:
            errors.append(out.result.error)
            log.warning("warm-up request failed: %s", out.result.error)
    return errors


async def _main_load(
    client: httpx.AsyncClient, spec: ClientSpec, requests: list[BenchRequest], cfg: RunConfig
) -> tuple[list[Outcome], float]:
    sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
    bar = tqdm(total=len(requests), desc=f"bench {spec.task}", disable=not cfg.progress)
    t0 = time.perf_counter()

    async def one(req: BenchRequest) -> Outcome:
        if sem is None:
            out = await _timed(req)
        else:
            async with sem:
                out = await _timed(req)
        bar.update(1)
        return out

    async def _timed(req: BenchRequest) -> Outcome:
        sent_at = time.perf_counter() - t0
        out = await send_request(client, spec, req)
        out.result.sent_at = sent_at
        return out

    tasks = []
    for req, delay in zip(requests, arrival_delays(len(requests), cfg.request_rate, cfg.seed)):
        if delay:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(req)))
    outcomes = await asyncio.gather(*tasks)
    duration = time.perf_counter() - t0
    bar.close()
    return list(outcomes), duration
