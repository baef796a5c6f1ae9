"""Qwen3-Omni: time to first audio packet with async chunk vs without, audio RTF, text-only TTFT.

Three engines stay up in one process and run in alternating rounds (load from other
processes hits them alike):

- ``streamed``: the qwen_omni pipeline with async chunk (talker after the first reply
  token, code2wav every ``--chunk-frames`` frames);
- ``whole``: the same pipeline without async chunk (each stage waits for the whole
  output of the one before);
- ``vllm``: the thinker alone on a plain vLLM ``AsyncLLM`` (same engine arguments, the
  same thinker model), for text-only TTFT against ``modalities: ["text"]`` on ``streamed``.

Per request: ``audio_ttfp`` (submit -> first audio packet), ``audio_rtf`` (end-to-end
time / audio duration), ``ttft`` (submit -> first text). Reports medians, the ratios
whole/streamed TTFP, streamed TTFP at concurrency 4 / 1, text-only TTFT omnistage / vLLM,
and checks that both modes produce the same audio.

    python benchmarks/omni_streaming.py [--model DIR] [--rounds 3] [--chunk-frames 4] [--frames 60]

Without --model the tiny qwen3_omni fixture is built: the ratios show the pipeline's
scheduling on a tiny model, not a real model's compute.
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

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).parent / "results"
PROMPTS = ["hello, who are you?", "describe the picture and the sound", "the quick brown fox", "who are you?"]


async def speech(engine, prompt: str, params: list) -> dict:
    t0 = time.perf_counter()
    first_text = first_audio = None
    audio = None
    async for out in engine.generate(prompt, sampling_params_list=params):
        now = time.perf_counter()
        if first_text is None and out.delta.get("text"):
            first_text = now
        if first_audio is None and out.delta.get("audio") is not None:
            first_audio = now
        if out.finished and out.audio is not None:
            audio = out
    end = time.perf_counter()
    seconds = len(audio.audio) / audio.sample_rate
    return {"ttft": first_text - t0, "ttfp": first_audio - t0, "e2e": end - t0, "audio_s": seconds,
            "rtf": (end - t0) / seconds, "audio": audio.audio}


async def text_only(engine, ids: list[int], params: list) -> dict:
    """The same token ids the plain-vLLM baseline gets (no chat templating on either side)."""
    t0 = time.perf_counter()
    async for out in engine.generate({"prompt_token_ids": ids}, sampling_params_list=params,
                                     output_modalities=["text"]):
        if out.delta.get("text"):
            return {"ttft": time.perf_counter() - t0}
    raise RuntimeError("no text")


async def vllm_text(llm, ids: list[int], params) -> dict:
    from vllm.inputs.engine import tokens_input

    t0 = time.perf_counter()
    ttft = None
    async for out in llm.generate(tokens_input(ids), params, request_id=uuid.uuid4().hex):
        if ttft is None and out.outputs[0].token_ids:
            ttft = time.perf_counter() - t0
    return {"ttft": ttft}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


async def main(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from omnistage import AsyncOmni
    from omnistage.models.qwen_omni.thinker import vllm_thinker_importable
    from omnistage.models.qwen_omni.vllm_plugin import ARCHITECTURE

    torch.set_num_threads(1)
    model = args.model
    if model is None:
        from omnistage.testing.tiny import build

        model = str(build("qwen3_omni", tempfile.mkdtemp(prefix="omnistage-bench-omni-")))
    engine_args = {"max_model_len": 1024, "max_num_seqs": 8}
    modes = {"streamed": AsyncOmni(model, deploy_config={"async_chunk": True}, **engine_args),
             "whole": AsyncOmni(model, deploy_config={"async_chunk": False}, **engine_args)}
    for engine in modes.values():
        await engine.start()
    vllm_args = {"model": model, "max_model_len": 1024, "max_num_seqs": 8, "enforce_eager": True,
                 "kv_cache_memory_bytes": 64 << 20, "disable_log_stats": True}
    if vllm_thinker_importable() is not None:  # the same thinker model the qwen_omni stage serves here
        vllm_args["hf_overrides"] = {"architectures": [ARCHITECTURE]}
    llm = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**vllm_args))
    tok = AutoTokenizer.from_pretrained(model)
    thinker = {"temperature": 0, "max_tokens": args.text_tokens, "ignore_eos": True}
    params = [thinker, {"temperature": 0, "max_tokens": args.frames + 1}, {"chunk_frames": args.chunk_frames}]
    plain = SamplingParams(temperature=0, max_tokens=args.text_tokens, ignore_eos=True,
                           output_kind=RequestOutputKind.DELTA)
    prompt_ids = {p: list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                  return_dict=True)["input_ids"]) for p in PROMPTS}
    rows = {m: {c: [] for c in args.concurrency} for m in (*modes, "text_only", "vllm")}
    max_diff = 0.0

    async def round_(c: int, order: list[str]) -> None:
        nonlocal max_diff
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(c)]
        got = {}
        for name in order:
            if name in modes:
                got[name] = await asyncio.gather(*(speech(modes[name], p, params) for p in prompts))
            elif name == "text_only":
                got[name] = await asyncio.gather(*(text_only(modes["streamed"], prompt_ids[p], params)
                                                   for p in prompts))
            else:
                got[name] = await asyncio.gather(*(vllm_text(llm, prompt_ids[p], plain) for p in prompts))
            rows[name][c].extend(got[name])
        for a, b in zip(got["streamed"], got["whole"]):
            max_diff = max(max_diff, float(np.abs(a["audio"] - b["audio"]).max()))

    names = ["streamed", "whole", "text_only", "vllm"]
    try:
        await round_(1, names)  # warm-up (first-request costs) outside the measurement
        for k in rows:
            rows[k][1].clear()
        for r in range(args.rounds):
            for c in args.concurrency:
                await round_(c, names if r % 2 == 0 else list(reversed(names)))
    finally:
        for engine in modes.values():
            await engine.shutdown()
        llm.shutdown()
    table = []
    for c in args.concurrency:
        s, w, t, v = (rows[m][c] for m in ("streamed", "whole", "text_only", "vllm"))
        table.append({
            "concurrency": c, "requests_per_mode": len(s),
            "streamed_ttfp_ms": 1000 * median(s, "ttfp"), "whole_ttfp_ms": 1000 * median(w, "ttfp"),
            "ttfp_speedup": median(w, "ttfp") / median(s, "ttfp"),
            "streamed_rtf": median(s, "rtf"), "whole_rtf": median(w, "rtf"),
            "streamed_e2e_ms": 1000 * median(s, "e2e"), "whole_e2e_ms": 1000 * median(w, "e2e"),
            "audio_duration_s": median(s, "audio_s"),
            "text_only_ttft_ms": 1000 * median(t, "ttft"), "vllm_ttft_ms": 1000 * median(v, "ttft"),
            "text_only_ttft_ratio": median(t, "ttft") / median(v, "ttft"),
        })
    growth = None
    if 1 in args.concurrency and 4 in args.concurrency:
        growth = median(rows["streamed"][4], "ttfp") / median(rows["streamed"][1], "ttfp")
    return {"model": model, "rounds": args.rounds, "chunk_frames": args.chunk_frames, "frames": args.frames,
            "text_tokens": args.text_tokens, "engine_args": engine_args,
            "thinker": "vLLM's own" if "hf_overrides" not in vllm_args else "text-only (vllm_thinker.py)",
            "max_abs_audio_diff_streamed_vs_whole": max_diff, "ttfp_growth_c4_over_c1": growth, "results": table}


def write(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "omni_streaming.json").write_text(json.dumps(report, indent=2) + "\n")
    growth = report["ttfp_growth_c4_over_c1"]
    lines = [
        "# Qwen3-Omni streaming: async chunk vs whole, text-only TTFT vs plain vLLM (qwen_omni)",
        "",
        f"model: `{report['model']}` (thinker: {report['thinker']}); {report['text_tokens']} reply tokens and "
        f"{report['frames']} codec frames per request, code2wav pieces of {report['chunk_frames']} frames; engine "
        f"args {report['engine_args']}; medians over {report['rounds']} alternating rounds. audio_ttfp = submit -> "
        "first audio packet; audio_rtf = end-to-end time / audio duration; text-only = `modalities: [\"text\"]` on "
        "the streamed engine vs the same thinker on a plain vLLM AsyncLLM in the same process, both given the chat "
        "prompt's token ids.",
        (f"Streamed and whole audio max |diff|: {report['max_abs_audio_diff_streamed_vs_whole']:.2e}. "
         + (f"Streamed TTFP c=4 / c=1: {growth:.2f}." if growth is not None else "")),
        "",
        ("| concurrency | streamed TTFP ms | whole TTFP ms | TTFP speed-up | streamed RTF | whole RTF | "
         "audio s | text-only TTFT ms | vLLM TTFT ms | TTFT ratio |"),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(f"| {r['concurrency']} | {r['streamed_ttfp_ms']:.1f} | {r['whole_ttfp_ms']:.1f} | "
                     f"{r['ttfp_speedup']:.2f}x | {r['streamed_rtf']:.3f} | {r['whole_rtf']:.3f} | "
                     f"{r['audio_duration_s']:.2f} | {r['text_only_ttft_ms']:.1f} | {r['vllm_ttft_ms']:.1f} | "
                     f"{r['text_only_ttft_ratio']:.3f} |")
    (RESULTS / "omni_streaming.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a Qwen3-Omni folder (default: build the tiny fixture)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk-frames", type=int, default=4)
    parser.add_argument("--frames", type=int, default=60, help="codec frames per request (12.5 per second)")
    parser.add_argument("--text-tokens", type=int, default=32, help="reply tokens per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    write(asyncio.run(main(parser.parse_args())))
