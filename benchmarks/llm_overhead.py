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

Long-output mode (``--lengths 128,512,2048``): per output length and
concurrency, omnistage's extra time per output token, ``(t_omni - t_direct) /
tokens`` in wall time and in CPU time of the event loop's thread (where the
orchestrator and vLLM's front end run; vLLM's engine core is a child process
on both sides), and the throughput
ratio. Flat in length means the streaming path costs linear time. Both sides
consume every streamed output as a user does (text deltas, and token-id
deltas with ``--outputs text+token_ids``). Results go to
``results/llm_overhead_long_<label>.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import json
import os
import statistics
import sys
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
    return {
        "wall_s": wall,
        "output_tokens": sum(tokens),
        "throughput_tok_s": sum(tokens) / wall,
        "ttft_mean_s": statistics.mean(ttfts),
        "ttft_median_s": statistics.median(ttfts),
    }


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
    direct = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=model, kv_cache_memory_bytes=64 << 20, disable_log_stats=True, **engine_kw)
    )
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
                    print(
                        f"c={conc} round {r} {mode:9s} {res['throughput_tok_s']:8.1f} tok/s "
                        f"ttft {res['ttft_mean_s'] * 1e3:7.1f} ms",
                        flush=True,
                    )
            d, o = summarize(rounds["direct"]), summarize(rounds["omnistage"])
            results[f"concurrency_{conc}"] = {
                "requests": n,
                "direct": d,
                "omnistage": o,
                "throughput_ratio": o["throughput_tok_s"] / d["throughput_tok_s"],
                "ttft_ratio": o["ttft_mean_s"] / d["ttft_mean_s"],
            }
        return {
            "model": model,
            "engine_args": engine_kw,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "results": results,
        }
    finally:
        await omni.shutdown()
        direct.shutdown()


def write_results(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "llm_overhead.json").write_text(json.dumps(report, indent=2))
    lines = [
        "# llm stage overhead: omnistage chat pipeline vs direct vLLM AsyncLLM",
        "",
        f"model: `{report['model']}`; engine args {report['engine_args']}; max_tokens {report['max_tokens']}; "
        f"median of {report['rounds']} alternating rounds. Targets: throughput >= 0.95x, TTFT <= 1.05x.",
        "",
        "| concurrency | direct tok/s | omnistage tok/s | ratio | direct TTFT ms | omnistage TTFT ms | TTFT ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, r in report["results"].items():
        d, o = r["direct"], r["omnistage"]
        lines.append(
            f"| {key.split('_')[1]} | {d['throughput_tok_s']:.1f} | {o['throughput_tok_s']:.1f} | "
            f"{r['throughput_ratio']:.3f} | {d['ttft_mean_s'] * 1e3:.1f} | {o['ttft_mean_s'] * 1e3:.1f} | "
            f"{r['ttft_ratio']:.3f} |"
        )
    (RESULTS / "llm_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# ---------------------------------------------------------------- long-output mode


async def _one_direct(engine, tokenizer, p: str, *, max_tokens: int, want_ids: bool) -> tuple[int, str]:
    from vllm import SamplingParams
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind

    sp = SamplingParams(**params(max_tokens), output_kind=RequestOutputKind.DELTA)
    parts: list[str] = []
    ids: list[int] = []
    n = 0
    async for ro in engine.generate(tokens_input(tokenizer.encode(p), prompt=p), sp, request_id=uuid.uuid4().hex):
        comp = ro.outputs[0]
        if comp.text:
            parts.append(comp.text)
        if want_ids:
            ids.extend(comp.token_ids)
        n += len(comp.token_ids)
    return n, "".join(parts)


async def _one_omni(
    omni, p: str, *, max_tokens: int, want_ids: bool, carried: list[int] | None = None
) -> tuple[int, str]:
    """What a streaming caller reads (as the chat route does): each output's delta. ``carried`` counts the
    text characters and token ids every output holds in its whole-value fields (a deterministic sign of
    per-token copies of everything so far: flat per token when only deltas travel)."""
    parts: list[str] = []
    ids: list[int] = []
    n = 0
    async for out in omni.generate(p, sampling_params_list=[params(max_tokens)]):
        if carried is not None:
            carried[0] += len(out.text or "") + len(out.token_ids or ()) + len(out.prompt_token_ids or ())
        text = out.delta.get("text")
        if text:
            parts.append(text)
        if want_ids and out.delta.get("token_ids") is not None:
            ids.extend(out.delta["token_ids"])
        if out.finished:  # the running out.num_tokens lags when the last tokens decode to no text yet
            n = int(out.metrics[0]["num_tokens"])
    return n, "".join(parts)


async def _timed(one, prompts: list[str], concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)

    async def wrapped(p: str) -> tuple[int, str]:
        async with sem:
            return await one(p)

    # The event loop's thread runs all of the front end on both sides (vLLM's output handler and
    # detokenizer, omnistage's orchestrator); other threads only poll, in proportion to wall time.
    cpu0, t0 = time.thread_time(), time.perf_counter()
    outs = await asyncio.gather(*(wrapped(p) for p in prompts))
    wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    return {"wall_s": wall, "cpu_s": cpu, "output_tokens": sum(n for n, _ in outs), "texts": [t for _, t in outs]}


def _own_cpu_s(prof, package_dir: str) -> float:
    """Seconds spent in omnistage's own code (its functions, and builtins they call) in a cProfile run:
    the orchestrator's per-token work without vLLM's, so noise from other processes hardly touches it."""
    import pstats

    total = 0.0
    for (file, _, _), (_, _, tt, _, callers) in pstats.Stats(prof).stats.items():
        if file.startswith(package_dir):
            total += tt
        elif file == "~":  # a builtin: count the calls made from omnistage code
            total += sum(v[2] for caller, v in callers.items() if caller[0].startswith(package_dir))
    return total


def _without_texts(run: dict) -> dict:
    return {k: v for k, v in run.items() if k != "texts"}


def _compare(direct: list[dict], omni: list[dict], expected_tokens: int) -> dict:
    """Paired per round (the two runs of a round are adjacent in time), median over rounds."""
    for r in direct + omni:
        if r["output_tokens"] != expected_tokens:
            raise RuntimeError(f"expected {expected_tokens} output tokens, got {r['output_tokens']}")
    med = statistics.median
    extra_wall = [(o["wall_s"] - d["wall_s"]) / expected_tokens * 1e6 for d, o in zip(direct, omni)]
    extra_cpu = [(o["cpu_s"] - d["cpu_s"]) / expected_tokens * 1e6 for d, o in zip(direct, omni)]
    ratios = [d["wall_s"] / o["wall_s"] for d, o in zip(direct, omni)]
    same = sum(a == b for d, o in zip(direct, omni) for a, b in zip(d["texts"], o["texts"]))
    return {
        "output_tokens": expected_tokens,
        "direct_tok_s": med(expected_tokens / d["wall_s"] for d in direct),
        "omnistage_tok_s": med(expected_tokens / o["wall_s"] for o in omni),
        "throughput_ratio": med(ratios),
        "extra_wall_us_per_token": med(extra_wall),
        "extra_wall_us_per_token_min_max": [min(extra_wall), max(extra_wall)],
        "extra_cpu_us_per_token": med(extra_cpu),
        "extra_cpu_us_per_token_min_max": [min(extra_cpu), max(extra_cpu)],
        "direct_cpu_us_per_token": med(d["cpu_s"] / expected_tokens * 1e6 for d in direct),
        "identical_texts": f"{same}/{sum(len(d['texts']) for d in direct)}",
        "direct": [_without_texts(r) for r in direct],
        "omnistage": [_without_texts(r) for r in omni],
    }


async def _long_case(direct, tokenizer, omni, output: str, length: int, conc: int, args, package_dir: str) -> dict:
    """Both paths on the same prompts in alternating rounds, then one profiled omnistage pass."""
    want_ids = "token_ids" in output
    n = max(conc, -(-args.tokens_per_round // length))
    prompts = make_prompts(n, seed=length + conc)
    paths = {
        "direct": functools.partial(_one_direct, direct, tokenizer, max_tokens=length, want_ids=want_ids),
        "omnistage": functools.partial(_one_omni, omni, max_tokens=length, want_ids=want_ids),
    }
    runs: dict[str, list[dict]] = {"direct": [], "omnistage": []}
    for r in range(args.rounds):
        for mode in ("direct", "omnistage") if r % 2 == 0 else ("omnistage", "direct"):
            res = await _timed(paths[mode], prompts, conc)
            runs[mode].append(res)
            print(
                f"{output} len={length} c={conc} round {r} {mode:9s} {res['output_tokens'] / res['wall_s']:8.1f} "
                f"tok/s cpu {res['cpu_s'] / res['output_tokens'] * 1e6:7.1f} us/tok",
                flush=True,
            )
    # Not among the timed rounds: profiling slows everything it sees. The profiler's default clock (a CPU-time
    # clock costs a syscall per call, which swamps what is measured) also counts time preempted by other
    # processes; that noise only adds, so the minimum over passes is kept.
    own_us = []
    for _ in range(args.profiled_passes):
        carried = [0]
        prof = cProfile.Profile()
        prof.enable()
        await _timed(functools.partial(paths["omnistage"], carried=carried), prompts, conc)
        prof.disable()
        own_us.append(_own_cpu_s(prof, package_dir) / (n * length) * 1e6)
    print(f"{output} len={length} c={conc} omnistage code {min(own_us):.2f} us/token (profiled)", flush=True)
    return {
        "length": length,
        "concurrency": conc,
        "requests": n,
        "omnistage_code_us_per_token_profiled": min(own_us),
        "omnistage_code_us_per_token_passes": own_us,
        "carried_elements_per_token": carried[0] / (n * length),
        **_compare(runs["direct"], runs["omnistage"], n * length),
    }


async def long_async(args) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    import omnistage
    from omnistage import AsyncOmni

    package_dir = str(Path(omnistage.__file__).parent) + os.sep
    lengths = [int(x) for x in args.lengths.split(",")]
    concs = [int(x) for x in args.concurrency.split(",")]
    max_len = max(lengths) + 128  # room for the prompt (at most ~60 tokens here)
    model = args.model
    if model is None:
        from omnistage.models.chat.tiny import build

        model = tempfile.mkdtemp(prefix="omnistage-bench-chat-long-")
        build(Path(model), max_position_embeddings=max_len)
    engine_kw = {"max_model_len": max_len, "max_num_seqs": max(concs), "dtype": "float32", "enforce_eager": True}
    direct = AsyncLLM.from_engine_args(
        AsyncEngineArgs(model=model, kv_cache_memory_bytes=64 << 20, disable_log_stats=True, **engine_kw)
    )
    tokenizer = direct.get_tokenizer()
    results: dict = {}
    try:
        for output in args.outputs.split(","):
            # One omnistage engine per output type: the stage's engine_output_type decides what it streams.
            omni = AsyncOmni(model, engine_output_type=output, **engine_kw)
            await omni.start()
            try:
                warm = make_prompts(4, seed=99)
                await _timed(functools.partial(_one_direct, direct, tokenizer, max_tokens=16, want_ids=True), warm, 4)
                await _timed(functools.partial(_one_omni, omni, max_tokens=16, want_ids=True), warm, 4)
                results[output] = {
                    f"len_{length}_c_{conc}": await _long_case(
                        direct, tokenizer, omni, output, length, conc, args, package_dir
                    )
                    for length in lengths
                    for conc in concs
                }
            finally:
                await omni.shutdown()
    finally:
        direct.shutdown()
    return {
        "command": " ".join(["python", *sys.argv]),
        "model": model,
        "omnistage_path": package_dir.rstrip(os.sep),
        "engine_args": engine_kw,
        "rounds": args.rounds,
        "tokens_per_round": args.tokens_per_round,
        "profiled_passes": args.profiled_passes,
        "results": results,
    }


def write_long_results(report: dict, label: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"llm_overhead_long_{label}.json").write_text(json.dumps(report, indent=2))
    header = (
        f"omnistage from `{report['omnistage_path']}`; engine args {report['engine_args']}; greedy, "
        f"ignore_eos; ~{report['tokens_per_round']} output tokens per path per round (at least one request "
        f"per slot); median of {report['rounds']} alternating rounds, differences paired per round. "
        "Extra = (omnistage - direct) / output tokens, in wall time and in CPU time of the event loop's "
        "thread (orchestrator + vLLM front end; the engine core is a child process on both sides)."
    )
    ranges = (
        "Ranges are min..max over rounds (the noise floor on this shared machine). 'omnistage code' is the "
        "CPU time spent in omnistage's own code (its functions and the builtins they call), minimum over "
        f"{report['profiled_passes']} extra omnistage passes under cProfile: "
        "profiling inflates it, but it excludes vLLM and most of the noise from other processes, so its growth "
        "with length is the cleanest sign of a non-linear streaming path. 'Carried' counts, in those "
        "passes, the text characters + token ids + prompt token ids that the outputs hold in their "
        "whole-value fields (`text`, `token_ids`, `prompt_token_ids`), per output token: deterministic; it "
        "grows with length when every streamed output carries everything so far."
    )
    columns = (
        "| outputs | length | concurrency | requests | direct tok/s | omnistage tok/s | throughput ratio | "
        "extra wall us/token (range) | extra CPU us/token (range) | direct CPU us/token | identical texts | "
        "omnistage code us/token (profiled) | carried per token |"
    )
    lines = [
        f"# llm stage per-token overhead vs output length ({label})",
        "",
        f"command: `{report['command']}`",
        "",
        header,
        "",
        ranges,
        "",
        columns,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for output, by_case in report["results"].items():
        for r in by_case.values():
            (wl, wh), (cl, ch) = r["extra_wall_us_per_token_min_max"], r["extra_cpu_us_per_token_min_max"]
            lines.append(
                f"| {output} | {r['length']} | {r['concurrency']} | {r['requests']} | {r['direct_tok_s']:.1f} | "
                f"{r['omnistage_tok_s']:.1f} | {r['throughput_ratio']:.3f} | "
                f"{r['extra_wall_us_per_token']:.1f} ({wl:.0f}..{wh:.0f}) | "
                f"{r['extra_cpu_us_per_token']:.1f} ({cl:.0f}..{ch:.0f}) | {r['direct_cpu_us_per_token']:.1f} | "
                f"{r['identical_texts']} | {r['omnistage_code_us_per_token_profiled']:.2f} | "
                f"{r['carried_elements_per_token']:.1f} |"
            )
    (RESULTS / f"llm_overhead_long_{label}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-c1", type=int, default=8)
    parser.add_argument("--requests-c16", type=int, default=32)
    parser.add_argument("--lengths", default=None, help="long-output mode: output lengths, e.g. 128,512,2048")
    parser.add_argument("--concurrency", default="1,4", help="long-output mode: concurrencies")
    parser.add_argument(
        "--outputs",
        default="text,text+token_ids",
        help="long-output mode: the stage's engine_output_type values to measure",
    )
    parser.add_argument(
        "--tokens-per-round",
        type=int,
        default=2048,
        help="long-output mode: output tokens per path per round (at least one request per slot)",
    )
    parser.add_argument(
        "--profiled-passes",
        type=int,
        default=3,
        help="long-output mode: extra cProfile'd omnistage passes per case (the minimum is reported)",
    )
    parser.add_argument("--label", default="run", help="long-output mode: results file suffix (before/after)")
    args = parser.parse_args()
    if args.lengths:
        write_long_results(asyncio.run(long_async(args)), args.label)
    else:
        write_results(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
