"""What the talker's media conditioning costs Qwen3-Omni per request, now that the thinker engine hands its own
hidden states out (models/qwen_omni/vllm_speaking.py + stages/llm/hidden_connector.py): the speaking stage's
prefill (it also writes the accepted layer's hidden state of every token into a cache-only layer, and the prompt's
rows to a file the stage reads) against vLLM's own thinker on a plain engine with the same arguments, and the KV
cache each token takes.

For each media prompt (audio, image, audio+image), rendered once by the thinker's vLLM renderer, rounds alternate:
the plain engine's prefill + first token, and the speaking engine's prefill + first token + reading the rows (as a
media request runs). Medians; ratios against the plain engine in the same run. (Until 2026-12-05 a second,
pooling, engine repeated the prompt's encoders and layers for this: 2.0-2.3x the prefill when both ran at once,
and 79% of the tiny thinker's weights again; git history has that version of this script.)

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
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni_bench import model_folder, write_result


def kv_bytes_per_token(folder: Path, dtype: str | None) -> dict[str, int]:
    """Bytes of KV cache per token (the engine's dtype): the decoder's attention layers, and the hidden-state row."""
    config = json.loads((folder / "config.json").read_text())["thinker_config"]["text_config"]
    size = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype or "bfloat16"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    attention = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * size
    return {"attention": attention, "hidden_row": config["hidden_size"] * size}


async def main(args: argparse.Namespace) -> None:
    import torch
    from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams

    from omnistage import AsyncOmni
    from omnistage.models.qwen_omni.config import load_omni_config
    from omnistage.stages.llm.hidden import PATH_KEY, read_rows
    from omnistage.stages.llm.inputs import parse, render
    from tests.models import omni_media as media

    torch.set_num_threads(1)
    folder = model_folder(args.model, "qwen3_omni")
    config = load_omni_config(folder)
    clip, img = media.clip(2.0, 0), media.image(0)
    audio = {"type": "input_audio", "input_audio": {"data": media.wav_base64(clip), "format": "wav"}}
    image = {"type": "image_url", "image_url": {"url": media.png_url(img)}}
    prompts = {"audio": [audio], "image": [image], "audio+image": [image, audio]}
    omni = AsyncOmni(str(folder), max_model_len=2048, enable_prefix_caching=False)  # every prefill computed
    await omni.start()
    stage = omni.replicas(0)[0]
    plain = AsyncLLMEngine.from_engine_args(
        AsyncEngineArgs(
            model=str(folder),
            max_model_len=2048,
            enable_prefix_caching=False,
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
            dtype=config.dtype or "auto",
            mm_processor_cache_gb=0,
            disable_log_stats=True,
        )
    )
    try:
        rows = []
        for name, parts in prompts.items():
            ei = await render(
                stage.engine,
                parse({"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "what is this?"}]}]}),
            )

            async def prefill(engine, tag: str, rows_file: str | None = None) -> float:
                extra = {"kv_transfer_params": {PATH_KEY: rows_file}} if rows_file else None
                t = time.perf_counter()
                async for _ in engine.generate(
                    ei,
                    SamplingParams(max_tokens=1, temperature=0, extra_args=extra),
                    request_id=f"{name}-{tag}-{time.time_ns()}",
                ):
                    pass
                if rows_file:
                    read_rows(rows_file, len(ei["prompt_token_ids"]))
                    os.remove(rows_file)
                return time.perf_counter() - t

            def speaking(tag: str):
                return prefill(stage.engine, tag, os.path.join(stage.rows_dir, f"bench-{time.time_ns()}.rows"))

            await prefill(plain, "warm"), await speaking("warm")
            times: dict[str, list[float]] = {"plain": [], "speaking": []}
            for r in range(args.rounds):
                for kind in ("plain", "speaking") if r % 2 == 0 else ("speaking", "plain"):
                    times[kind].append(await (prefill(plain, "solo") if kind == "plain" else speaking("solo")))
            med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            rows.append(
                {
                    "prompt": name,
                    "prompt_tokens": len(ei["prompt_token_ids"]),
                    **{f"{k}_ms": round(v, 2) for k, v in med.items()},
                    "speaking_over_plain": round(med["speaking"] / med["plain"], 3),
                }
            )
            print(rows[-1], flush=True)
    finally:
        plain.shutdown()
        await omni.shutdown()
    kv = kv_bytes_per_token(folder, config.dtype)
    result = {
        "model": str(folder),
        "accept_hidden_layer": config.accept_hidden_layer,
        "rounds": args.rounds,
        "rows": rows,
        "kv_bytes_per_token": kv,
        "kv_share": round(kv["hidden_row"] / kv["attention"], 3),
    }
    lines = [
        "# Qwen3-Omni: the cost of the talker's media conditioning (the thinker engine's own hidden states)",
        "",
        f"model: `{folder}` (accept_hidden_layer {config.accept_hidden_layer}); medians of {args.rounds} "
        "alternating rounds; `plain` = vLLM's own thinker on a plain engine (prefill + first token), `speaking` "
        "= the speaking stage's engine on the same rendered input, which also writes the accepted layer into its "
        "cache and the prompt's rows to a file, read back here as the stage does.",
        "",
        "| prompt | tokens | plain ms | speaking ms | speaking / plain |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['prompt']} | {r['prompt_tokens']} | {r['plain_ms']} | {r['speaking_ms']} | {r['speaking_over_plain']} |"
        for r in rows
    ]
    lines += [
        "",
        f"KV cache per token: attention layers {kv['attention']:,} bytes, the hidden-state row "
        f"{kv['hidden_row']:,} bytes (+{result['kv_share']:.1%}). No second engine, no weights loaded twice.",
        "",
        "    python benchmarks/omni_hidden_cost.py --rounds " + str(args.rounds),
    ]
    write_result("omni_hidden_cost", result, lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(p.parse_args()))
