"""What the talker's media conditioning costs Qwen3-Omni per request: the hidden-state engine's extra prefill
(stages/llm/hidden.py, the thinker cut after ``accept_hidden_layer``) against the thinker's own prefill, and the
weights and process memory that engine holds.

For each media prompt (audio, image, video, audio+image), rendered once by the thinker's vLLM renderer, rounds
alternate: the generating engine's prefill alone (``max_tokens=1``), the hidden-state engine's ``encode`` alone,
and both at once (as a request runs them). Medians; ratios against the thinker's prefill in the same run.
Weights: parameters each engine loads, counted from the checkpoint (the hidden engine skips decoder layers
>= ``accept_hidden_layer``, the talker and code2wav; vLLM's pooling adapter builds no ``lm_head``).

    python benchmarks/omni_hidden_cost.py [--model DIR] [--rounds 5]

Without --model the tiny qwen3_omni fixture is built (3 thinker layers, the talker reads layer 2): the time
ratios then show a tiny model, where fixed per-request overheads dominate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).parent / "results"


def weights(folder: Path, accept: int) -> dict[str, int]:
    from safetensors import safe_open

    from omnistage.models.qwen_omni.checkpoint import _shards

    counts = {"thinker": 0, "hidden_engine": 0}
    for name, path in _shards(folder).items():
        if not name.startswith("thinker."):
            continue
        with safe_open(str(path), "pt") as f:
            n = f.get_slice(name).get_shape()
        size = 1
        for d in n:
            size *= d
        counts["thinker"] += size
        layer = name.split("thinker.model.layers.")[1].split(".")[0] if "thinker.model.layers." in name else None
        if not name.startswith("thinker.lm_head.") and (layer is None or int(layer) < accept):
            counts["hidden_engine"] += size
    return counts


def rss_by_process() -> dict[int, float]:
    import psutil

    me = psutil.Process()
    return {p.pid: p.memory_info().rss / 2**20 for p in me.children(recursive=True)}


async def main(args: argparse.Namespace) -> None:
    import torch
    from vllm import SamplingParams

    from omnistage import AsyncOmni
    from omnistage.models.qwen_omni.config import load_omni_config
    from omnistage.stages.llm.inputs import parse, render
    from tests.models.qwen_omni import media

    torch.set_num_threads(1)
    folder = Path(args.model) if args.model else Path(tempfile.mkdtemp(prefix="omnistage-bench-hidden-")) / "omni"
    if not args.model:
        from omnistage.models.qwen_omni import tiny

        tiny.build(folder)
    config = load_omni_config(folder)
    clip, img = media.clip(2.0, 0), media.image(0)
    audio = {"type": "input_audio", "input_audio": {"data": media.wav_base64(clip), "format": "wav"}}
    image = {"type": "image_url", "image_url": {"url": media.png_url(img)}}
    prompts = {
        "audio": [audio],
        "image": [image],
        "audio+image": [image, audio],
    }
    before = rss_by_process()
    omni = AsyncOmni(str(folder), max_model_len=2048, enable_prefix_caching=False)  # every prefill computed
    await omni.start()
    try:
        thinker = omni.replicas(0)[0]
        after = rss_by_process()
        rows = []
        for name, parts in prompts.items():
            ei = await render(thinker.engine, parse({"messages": [{"role": "user", "content": [*parts, {
                "type": "text", "text": "what is this?"}]}]}))

            async def prefill(tag: str) -> float:
                t = time.perf_counter()
                async for _ in thinker.engine.generate(ei, SamplingParams(max_tokens=1, temperature=0),
                                                       request_id=f"{name}-{tag}-{time.time_ns()}"):
                    pass
                return time.perf_counter() - t

            async def encode() -> float:
                t = time.perf_counter()
                await thinker.hidden.encode(ei, f"{name}-{time.time_ns()}")
                return time.perf_counter() - t

            async def both() -> float:
                t = time.perf_counter()
                await asyncio.gather(prefill("both"), encode())
                return time.perf_counter() - t

            await prefill("warm"), await encode()
            times: dict[str, list[float]] = {"prefill": [], "encode": [], "both": []}
            for _ in range(args.rounds):
                times["prefill"].append(await prefill("solo"))
                times["encode"].append(await encode())
                times["both"].append(await both())
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            rows.append({"prompt": name, "prompt_tokens": len(ei["prompt_token_ids"]), **{f"{k}_ms": round(v, 2)
                         for k, v in med.items()}, "encode_over_prefill": round(med["encode"] / med["prefill"], 3),
                         "both_over_prefill": round(med["both"] / med["prefill"], 3)})
            print(rows[-1], flush=True)
    finally:
        await omni.shutdown()
    w = weights(folder, config.accept_hidden_layer)
    new = {pid: mb for pid, mb in after.items() if pid not in before}
    result = {"model": str(folder), "accept_hidden_layer": config.accept_hidden_layer, "rounds": args.rounds,
              "rows": rows, "weights": w, "weight_share": round(w["hidden_engine"] / w["thinker"], 3),
              "engine_process_rss_mb": {str(k): round(v, 1) for k, v in sorted(new.items())}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "omni_hidden_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Qwen3-Omni: the cost of the talker's media conditioning (hidden-state engine)", "",
             f"model: `{folder}` (accept_hidden_layer {config.accept_hidden_layer}); medians of {args.rounds} "
             "alternating rounds; `prefill` = the generating thinker's prefill + first token, `encode` = the hidden-"
             "state engine on the same rendered input, `both` = the two at once (what a media request runs).", "",
             "| prompt | tokens | prefill ms | encode ms | both ms | encode / prefill | both / prefill |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['prompt']} | {r['prompt_tokens']} | {r['prefill_ms']} | {r['encode_ms']} | {r['both_ms']} | "
              f"{r['encode_over_prefill']} | {r['both_over_prefill']} |" for r in rows]
    lines += ["", f"Weights (thinker parameters loaded): generating engine {w['thinker']:,}, hidden-state engine "
              f"{w['hidden_engine']:,} ({result['weight_share']:.0%}).",
              f"Engine processes started (RSS MiB): {result['engine_process_rss_mb']}.", "",
              "    python benchmarks/omni_hidden_cost.py --rounds " + str(args.rounds)]
    (RESULTS / "omni_hidden_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(p.parse_args()))
