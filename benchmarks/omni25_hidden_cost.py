"""What the talker's conditioning costs Qwen2.5-Omni per spoken request: the thinker's last-layer hidden states of
the prompt and of the reply fed back, before and after the thinker engine handed them out itself.

- `before` (until 2026-12-05, rebuilt here with vLLM's public API): vLLM's thinker on a plain engine generates the
  reply, then a second engine of the same folder in pooling mode (``runner="pooling"``, ``token_embed`` without
  activation: the normed last layer) prefills prompt + reply[:-1] again, encoders included.
- `after`: the speaking stage's engine (models/qwen2_5_omni/vllm_speaking.py + stages/llm/hidden_connector.py)
  generates the reply while its connector writes every computed token's row to a file; the rows are read back as the
  stage does.

For each prompt (text, audio, image), rendered once by the thinker's vLLM renderer, rounds alternate the two ways;
medians, ratios in the same run; `plain` (the plain engine's reply alone) shows what each way adds. Greedy,
``ignore_eos``, ``--tokens`` reply tokens.

    python benchmarks/omni25_hidden_cost.py [--model DIR] [--rounds 5] [--tokens 32]

Without --model the tiny qwen2_5_omni fixture is built: a tiny model, where fixed per-request overheads dominate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni_bench import model_folder, write_result


async def main(args: argparse.Namespace) -> None:
    import torch
    from vllm import AsyncEngineArgs, AsyncLLMEngine, PoolingParams, SamplingParams

    from omnistage import AsyncOmni
    from omnistage.models.qwen2_5_omni.vllm_plugin import THINKER_ARCHITECTURE
    from omnistage.stages.llm.hidden import PATH_KEY, REPLY_KEY, read_rows
    from omnistage.stages.llm.inputs import parse, render
    from tests.models import omni_media as media

    torch.set_num_threads(1)
    folder = model_folder(args.model, "qwen2_5_omni")
    clip, img = media.clip(1.0, 0), media.image(0)
    prompts = {
        "text": [],
        "audio": [{"type": "input_audio", "input_audio": {"data": media.wav_base64(clip), "format": "wav"}}],
        "image": [{"type": "image_url", "image_url": {"url": media.png_url(img)}}],
    }
    common = dict(
        model=str(folder),
        max_model_len=1024,
        enable_prefix_caching=False,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
        mm_processor_cache_gb=0,
        disable_log_stats=True,
        hf_overrides={"architectures": [THINKER_ARCHITECTURE]},
    )
    omni = AsyncOmni(str(folder), max_model_len=1024, enable_prefix_caching=False)  # every prefill computed
    await omni.start()
    stage = omni.replicas(0)[0]
    dtype = str(stage.engine.model_config.dtype).removeprefix("torch.")
    plain = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**common, dtype=dtype))
    pooling = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**common, dtype=dtype, runner="pooling", convert="embed"))
    ids = iter(range(10**9))
    try:
        rows = []
        for name, parts in prompts.items():
            ei = await render(
                stage.engine,
                parse({"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "what is this?"}]}]}),
            )
            n = len(ei["prompt_token_ids"])

            async def generate(engine, extra=None) -> list[int]:
                params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True, extra_args=extra)
                async for out in engine.generate(ei, params, request_id=f"{name}-{next(ids)}"):
                    pass
                return list(out.outputs[0].token_ids)

            async def before() -> float:
                t = time.perf_counter()
                reply = await generate(plain)
                fed = {**ei, "prompt_token_ids": list(ei["prompt_token_ids"]) + reply[:-1]}
                async for out in pooling.encode(
                    fed, PoolingParams(task="token_embed", use_activation=False), request_id=f"{name}-{next(ids)}"
                ):
                    pass
                assert out.outputs.data.shape[0] == n + len(reply) - 1
                return time.perf_counter() - t

            async def after() -> float:
                path = os.path.join(stage.rows_dir, f"bench-{next(ids)}.rows")
                t = time.perf_counter()
                reply = await generate(stage.engine, {"kv_transfer_params": {PATH_KEY: path, REPLY_KEY: True}})
                read_rows(path, n + len(reply) - 1)
                elapsed = time.perf_counter() - t
                os.remove(path)
                return elapsed

            async def alone() -> float:
                t = time.perf_counter()
                await generate(plain)
                return time.perf_counter() - t

            ways = {"plain": alone, "before": before, "after": after}
            for way in ways.values():  # warm
                await way()
            times: dict[str, list[float]] = {k: [] for k in ways}
            for r in range(args.rounds):
                for kind in list(ways) if r % 2 == 0 else list(ways)[::-1]:
                    times[kind].append(await ways[kind]())
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            rows.append(
                {
                    "prompt": name,
                    "prompt_tokens": n,
                    **{f"{k}_ms": round(v, 2) for k, v in med.items()},
                    "after_over_before": round(med["after"] / med["before"], 3),
                    "before_over_plain": round(med["before"] / med["plain"], 3),
                    "after_over_plain": round(med["after"] / med["plain"], 3),
                }
            )
            print(rows[-1], flush=True)
    finally:
        plain.shutdown()
        pooling.shutdown()
        await omni.shutdown()
    result = {"model": str(folder), "rounds": args.rounds, "reply_tokens": args.tokens, "rows": rows}
    lines = [
        "# Qwen2.5-Omni: the cost of the talker's conditioning (prompt + reply hidden states)",
        "",
        f"model: `{folder}`; {args.tokens} reply tokens (greedy, ignore_eos); medians of {args.rounds} "
        "alternating rounds. `before` = vLLM's thinker on a plain engine, then a second (pooling) engine "
        "prefilling prompt + reply again (the way until 2026-12-05); `after` = the speaking stage's engine, "
        "whose connector writes every computed token's row to a file, read back as the stage does; `plain` = the "
        "plain engine's reply alone (no hidden states: what text out costs).",
        "",
        "| prompt | tokens | plain ms | before ms | after ms | after / before | before / plain | after / plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['prompt']} | {r['prompt_tokens']} | {r['plain_ms']} | {r['before_ms']} | {r['after_ms']} | "
        f"{r['after_over_before']} | {r['before_over_plain']} | {r['after_over_plain']} |"
        for r in rows
    ]
    lines += [
        "",
        "Memory: `after` holds one copy of the thinker's weights (`before`: two) and one more KV-cache row "
        "of hidden_size per token.",
        "",
        f"    python benchmarks/omni25_hidden_cost.py --rounds {args.rounds} --tokens {args.tokens}",
    ]
    write_result("omni25_hidden_cost", result, lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=32)
    asyncio.run(main(p.parse_args()))
