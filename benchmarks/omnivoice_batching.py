"""OmniVoice under concurrency: N requests of different lengths through omnistage (``AsyncOmni``: the code
stage shares each unmasking step's forward among the running requests, then the decoder), sent one at a
time vs all at once, against the ideal: the same requests' codes in one static batch
(``OmniVoiceCodes.generate`` directly, no engine, no decoder).

    .venv/bin/python benchmarks/omnivoice_batching.py                  # tiny checkpoint, CPU, 1 thread

Rounds alternate the order of the modes (drift hits all alike); the fastest run of each is kept, all are
recorded. Writes benchmarks/results/omnivoice_batching.{json,md}. Ratios only: absolute times depend on the
machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from omnistage import AsyncOmni  # noqa: E402
from omnistage.models.omnivoice.engine import parse_request  # noqa: E402
from omnistage.models.omnivoice.model import OmniVoiceCodes  # noqa: E402
from omnistage.testing.streams import all_outputs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "models" / "omnivoice" / "tiny"
RESULTS = ROOT / "benchmarks" / "results"
TEXTS = [
    "hello.",
    "hello there, how are you today?",
    "the sun rises in the east and sets in the west.",
    "a somewhat longer sentence, so that the requests differ in length as real ones do.",
]


def requests(n: int, steps: int) -> list[tuple[dict, dict]]:
    return [({"prompt": TEXTS[i % len(TEXTS)]}, {"seed": i, "num_inference_steps": steps}) for i in range(n)]


async def one(omni: AsyncOmni, prompt: dict, params: dict) -> None:
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[params, None]))
    assert outs[-1].error is None and outs[-1].audio is not None


async def sequential(omni: AsyncOmni, reqs) -> float:
    t = time.perf_counter()
    for prompt, params in reqs:
        await one(omni, prompt, params)
    return time.perf_counter() - t


async def together(omni: AsyncOmni, reqs) -> float:
    t = time.perf_counter()
    await asyncio.gather(*(one(omni, p, q) for p, q in reqs))
    return time.perf_counter() - t


def ideal(model: OmniVoiceCodes, reqs, batched: bool = True) -> float:
    """The codes alone, no engine: one static batch, or one request after another."""
    t = time.perf_counter()
    rows = []
    for prompt, params in reqs:
        u = parse_request(prompt, params)
        ids, start = model.prompt(u.text, u.target_len, language=u.language, instruct=u.instruct)
        rows.append(model.new_request(ids, start, u.target_len, seed=u.seed, num_step=u.num_step))
    if batched:
        model.generate(rows)
    else:
        for row in rows:
            model.generate([row])
    return time.perf_counter() - t


async def main(args) -> dict:
    torch.set_num_threads(args.threads)
    reqs = requests(args.requests, args.steps)
    model = OmniVoiceCodes(TINY)
    omni = AsyncOmni(str(TINY))
    await omni.start()
    try:
        await together(omni, reqs)  # warm-up
        runs: dict[str, list[float]] = {"sequential": [], "engine": [], "ideal": [], "codes_one_by_one": []}
        for r in range(args.rounds):
            order = ["sequential", "engine", "ideal", "codes_one_by_one"]
            for mode in order if r % 2 == 0 else order[::-1]:
                if mode == "sequential":
                    runs[mode].append(await sequential(omni, reqs))
                elif mode == "engine":
                    runs[mode].append(await together(omni, reqs))
                else:
                    runs[mode].append(ideal(model, reqs, batched=mode == "ideal"))
    finally:
        await omni.shutdown()
    best = {k: min(v) for k, v in runs.items()}
    return {
        "requests": args.requests,
        "num_inference_steps": args.steps,
        "threads": args.threads,
        "rounds": args.rounds,
        "runs_s": runs,
        "sequential_over_engine": best["sequential"] / best["engine"],
        "engine_over_ideal": best["engine"] / best["ideal"],
        "codes_one_by_one_over_batched": best["codes_one_by_one"] / best["ideal"],
    }


def write(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "omnivoice_batching.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# OmniVoice: concurrent requests share the unmasking steps (tiny checkpoint, CPU)",
        "",
        f"{report['requests']} requests of 4 text lengths, {report['num_inference_steps']} unmasking steps, "
        f"{report['threads']} torch thread(s), best of {report['rounds']} rounds.",
        "",
        "| measure | ratio |",
        "|---|---|",
        f"| one at a time / all at once through the engine | {report['sequential_over_engine']:.2f}x |",
        f"| engine (all at once, codes + decoder) / ideal static batch (codes only) | "
        f"{report['engine_over_ideal']:.2f}x |",
        f"| codes only: one request after another / one static batch | "
        f"{report['codes_one_by_one_over_batched']:.2f}x |",
        "",
        "Above 1x in the first and last rows means batching gains. On one CPU thread a batched forward saves no",
        "work, and rows padded to the longest prompt (the unconditional rows too) add some; the engine's own cost",
        "is the second row (docs/families/omnivoice.md).",
        "",
        "Written by `benchmarks/omnivoice_batching.py`.",
    ]
    (RESULTS / "omnivoice_batching.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    report = asyncio.run(main(parser.parse_args()))
    write(report)
    print(json.dumps({k: v for k, v in report.items() if k != "runs_s"}, indent=2))
