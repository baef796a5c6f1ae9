"""Overhead of omnistage's llm stage: the one-stage chat pipeline through
AsyncOmni vs the same vLLM AsyncLLM called directly.

Same model, engine args, prompts and sampling params on both sides; both
engines stay up and the two paths run in alternating rounds (so load from
other processes hits both alike). Reports output-token throughput and TTFT
(time from submit to the first streamed output) at each concurrency, and the
ratios omnistage / direct.

    python benchmarks/llm_overhead.py [--model DIR] [--rounds 3]

Without --model the tiny chat fixture is built (its per-token compute is
tiny, so this is the worst case for relative overhead).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

# Identical thread settings for both engines (exported: omnistage keeps them).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).parent / "results"
WORDS = "the quick brown fox jumps over a lazy dog photo of red cat sitting on blue chair".split()


def make_prompts(n: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24))) for _ in range(n)]


def params(max_tokens: int) -> dict:
    return {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}


async def _drive(one, prompts: list[str], concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)
    ttfts, tokens = [], []

    async def wrapped(p: str) -> None:
        async with sem:
            t0 = time.perf_counter()
            first, n = await one(p)
            ttfts.append(first - t0)
            tokens.append(n)

    start = time.perf_counter()
    await asyncio.gather(*(wrapped(p) for p in prompts))
    wall = time.perf_counter() - start
    return {"wall_s": wall, "output_tokens": sum(tokens), "throughput_tok_s": sum(tokens) / wall,
            "ttft_mean_s": statistics.mean(ttfts), "ttft_median_s": statistics.median(ttfts)}


async def run_direct(engine, tokenizer, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    from vllm import SamplingParams
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind

    async def one(p: str):
        sp = SamplingParams(**params(max_tokens), output_kind=RequestOutputKind.DELTA)
        first, n = None, 0
        async for ro in engine.generate(tokens_input(tokenizer.encode(p), prompt=p), sp, request_id=uuid.uuid4().hex):
            first = first or time.perf_counter()
            n += len(ro.outputs[0].token_ids)
        return first, n

    return await _drive(one, prompts, concurrency)


async def run_omni(omni, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    async def one(p: str):
        first, n = None, 0
        async for out in omni.generate(p, sampling_params_list=[params(max_tokens)]):
            first = first or time.perf_counter()
            if out.finished:
                n = int(out.metrics[0]["num_tokens"])
        return first, n

    return await _drive(one, prompts, concurrency)


def summarize(runs: list[dict]) -> dict:
    keys = ("throughput_tok_s", "ttft_mean_s", "ttft_median_s")
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {"rounds": runs}


async def main_async(args) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from omnistage import AsyncOmni

    model = args.model
    if model is None:
        from omnistage.testing.tiny import build

        model = str(build("chat", Path(tempfile.mkdtemp(prefix="omnistage-bench-chat-"))))
    engine_kw = dict(max_model_len=1024, max_num_seqs=16, dtype="float32", enforce_eager=True)
    direct = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, kv_cache_memory_bytes=64 << 20,
                                                       disable_log_stats=True, **engine_kw))
    omni = AsyncOmni(model, **engine_kw)  # omnistage adds kv_cache_memory_bytes=64 MiB on CPU itself
    await omni.start()
    try:
        tokenizer = direct.get_tokenizer()
        warm = make_prompts(4, seed=99)
        await run_direct(direct, tokenizer, warm, 4, 8)
        await run_omni(omni, warm, 4, 8)
        results: dict = {}
        for conc, n in ((1, args.requests_c1), (16, args.requests_c16)):
            prompts = make_prompts(n, seed=conc)
            rounds = {"direct": [], "omnistage": []}
            for r in range(args.rounds):
                order = ("direct", "omnistage") if r % 2 == 0 else ("omnistage", "direct")
                for mode in order:
                    if mode == "direct":
                        res = await run_direct(direct, tokenizer, prompts, conc, args.max_tokens)
                    else:
                        res = await run_omni(omni, prompts, conc, args.max_tokens)
                    rounds[mode].append(res)
                    print(f"c={conc} round {r} {mode:9s} {res['throughput_tok_s']:8.1f} tok/s "
                          f"ttft {res['ttft_mean_s'] * 1e3:7.1f} ms", flush=True)
            d, o = summarize(rounds["direct"]), summarize(rounds["omnistage"])
            results[f"concurrency_{conc}"] = {
                "requests": n, "direct": d, "omnistage": o,
                "throughput_ratio": o["throughput_tok_s"] / d["throughput_tok_s"],
                "ttft_ratio": o["ttft_mean_s"] / d["ttft_mean_s"],
            }
        return {"model": model, "engine_args": engine_kw, "max_tokens": args.max_tokens,
                "rounds": args.rounds, "results": results}
    finally:
        await omni.shutdown()
        direct.shutdown()


def write_results(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "llm_overhead.json").write_text(json.dumps(report, indent=2))
    lines = ["# llm stage overhead: omnistage chat pipeline vs direct vLLM AsyncLLM", "",
             f"model: `{report['model']}`; engine args {report['engine_args']}; max_tokens {report['max_tokens']}; "
             f"median of {report['rounds']} alternating rounds. Targets: throughput >= 0.95x, TTFT <= 1.05x.", "",
             "| concurrency | direct tok/s | omnistage tok/s | ratio | direct TTFT ms | omnistage TTFT ms | TTFT ratio |",
             "|---|---|---|---|---|---|---|"]
    for key, r in report["results"].items():
        d, o = r["direct"], r["omnistage"]
        lines.append(f"| {key.split('_')[1]} | {d['throughput_tok_s']:.1f} | {o['throughput_tok_s']:.1f} | "
                     f"{r['throughput_ratio']:.3f} | {d['ttft_mean_s'] * 1e3:.1f} | {o['ttft_mean_s'] * 1e3:.1f} | "
                     f"{r['ttft_ratio']:.3f} |")
    (RESULTS / "llm_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-c1", type=int, default=8)
    parser.add_argument("--requests-c16", type=int, default=32)
    args = parser.parse_args()
    write_results(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
