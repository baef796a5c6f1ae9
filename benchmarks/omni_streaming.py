"""Qwen3-Omni: time to first audio packet with async chunk vs without, at concurrency 1 and 4, for text-in and
audio-in requests; audio RTF; thinker TTFT vs the same thinker on plain vLLM.

Three engines stay up in one process and run in alternating rounds (load from other
processes hits them alike):

- ``streamed``: the qwen_omni pipeline with async chunk (talker after the thinker's first reply
  tokens, code2wav from the first frame on: ``initial_codec_chunk_frames``, then every
  ``--chunk-frames``);
- ``whole``: the same pipeline without async chunk (each stage waits for the whole
  output of the one before);
- ``vllm``: vLLM's own thinker on a plain ``AsyncLLM`` with the engine arguments the stage runs
  (the checkpoint's dtype, float32 for the tiny fixture; no multimodal processor cache), against
  ``modalities: ["text"]`` on ``streamed`` given the very same prompt.

Two request kinds: ``text`` (a text question) and ``audio`` (a 1 s clip and a question: a chat with an
``input_audio`` part for speech; the text-only comparison gives both sides the same template text and
``multi_modal_data`` audio, rendered by vLLM's renderer on each side). Every request gets its own clip, so no
cache plays a part.

Each round also times the anchor's case on ``streamed``: a second request arriving ``--stagger-s`` into another's
speech (its TTFP against the round's concurrency-1 TTFP).

Per request: ``ttfp`` (submit -> first audio packet), ``rtf`` (end-to-end time / audio duration), ``ttft``
(submit -> first text). Reports medians per (kind, concurrency), the TTFP growth c=4 / c=1 and the text-only
TTFT ratio omnistage / vLLM, each as the median and range of the per-round ratios, and checks that streamed and
whole audio agree and that omnistage's text-only replies equal vLLM's.

    python benchmarks/omni_streaming.py [--model DIR] [--rounds 8] [--chunk-frames 4] [--frames 60]

Without --model the tiny qwen3_omni fixture is built: the ratios show the pipeline's
scheduling on a tiny model, not a real model's compute.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
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
KINDS = ("text", "audio")
CLIP_S = 1.0


class Prompts:
    """Request ``i`` of a round: the omnistage speech prompt, and the text-only prompt both sides get."""

    def __init__(self, tok, rate: int):
        self.tok, self.rate = tok, rate

    def clip(self, seed: int):
        from omnistage.bench.datasets import random_audio

        return random_audio(CLIP_S, seed, self.rate)

    def speech(self, kind: str, i: int, seed: int) -> dict:
        question = PROMPTS[i % len(PROMPTS)]
        if kind == "text":
            return {"prompt": question}
        from omnistage.bench.datasets import wav_bytes

        wav = base64.b64encode(wav_bytes(self.clip(seed), self.rate)).decode()
        return {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
                        {"type": "text", "text": question},
                    ],
                }
            ]
        }

    def text_only(self, kind: str, i: int, seed: int) -> dict:
        question = PROMPTS[i % len(PROMPTS)]
        if kind == "text":  # token ids: no templating on either side
            return {
                "prompt_token_ids": list(
                    self.tok.apply_chat_template(
                        [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=True
                    )["input_ids"]
                )
            }
        text = self.tok.apply_chat_template(
            [{"role": "user", "content": [{"type": "audio", "audio": "clip"}, {"type": "text", "text": question}]}],
            add_generation_prompt=True,
            tokenize=False,
        )
        return {"prompt": text, "multi_modal_data": {"audio": [(self.clip(seed), self.rate)]}}


async def speech(engine, prompt: dict, params: list) -> dict:
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
    return {
        "ttft": first_text - t0,
        "ttfp": first_audio - t0,
        "e2e": end - t0,
        "audio_s": seconds,
        "rtf": (end - t0) / seconds,
        "audio": audio.audio,
    }


async def text_only(engine, prompt: dict, params: list) -> dict:
    t0 = time.perf_counter()
    ttft, text = None, []
    async for out in engine.generate(prompt, sampling_params_list=params, output_modalities=["text"]):
        if out.delta.get("text"):
            ttft = ttft or time.perf_counter() - t0
            text.append(out.delta["text"])
    return {"ttft": ttft, "text": "".join(text)}


async def vllm_text(llm, prompt: dict, params) -> dict:
    """vLLM's documented route for a prompt it renders itself (``renderer.render_cmpl_async``), then generate."""
    from vllm.inputs import TextPrompt, TokensPrompt

    t0 = time.perf_counter()
    if "prompt_token_ids" in prompt:
        parsed = TokensPrompt(prompt_token_ids=prompt["prompt_token_ids"])
    else:
        parsed = TextPrompt(prompt=prompt["prompt"], multi_modal_data=prompt["multi_modal_data"])
    (engine_input,) = await llm.renderer.render_cmpl_async([parsed], llm.renderer.default_cmpl_tok_params)
    ttft, text = None, []
    async for out in llm.generate(engine_input, params, request_id=uuid.uuid4().hex):
        if out.outputs[0].text:  # the first text, as on omnistage's side (a token may detokenize to nothing yet)
            ttft = ttft or time.perf_counter() - t0
        text.append(out.outputs[0].text)
    return {"ttft": ttft, "text": "".join(text)}


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "per_round": values}


async def main(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from omnistage import AsyncOmni
    from omnistage.bench.datasets import AUDIO_RATE
    from omnistage.models.qwen_omni.config import load_omni_config

    torch.set_num_threads(1)
    model = args.model
    if model is None:
        from omnistage.testing.tiny import build

        model = str(build("qwen3_omni", tempfile.mkdtemp(prefix="omnistage-bench-omni-")))
    engine_args = {"max_model_len": 1024, "max_num_seqs": 8}
    modes = {
        "streamed": AsyncOmni(model, deploy_config={"async_chunk": True}, **engine_args),
        "whole": AsyncOmni(model, deploy_config={"async_chunk": False}, **engine_args),
    }
    for engine in modes.values():
        await engine.start()
    # the engine arguments the thinker stage runs with (omnistage.stages.llm.args.engine_args_for + thinker.py)
    vllm_args = {
        "model": model,
        **engine_args,
        "enforce_eager": True,
        "kv_cache_memory_bytes": 64 << 20,
        "disable_log_stats": True,
        "dtype": load_omni_config(model).dtype or "auto",
        "mm_processor_cache_gb": 0,
    }
    llm = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(**vllm_args))
    prompts = Prompts(AutoTokenizer.from_pretrained(model), AUDIO_RATE)
    thinker = {"temperature": 0, "max_tokens": args.text_tokens, "ignore_eos": True}
    params = [thinker, {"temperature": 0, "max_tokens": args.frames + 1}, {"chunk_frames": args.chunk_frames}]
    plain = SamplingParams(
        temperature=0, max_tokens=args.text_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    names = ["streamed", "whole", "text_only", "vllm"]
    rows: dict = {k: {m: {c: [] for c in args.concurrency} for m in names} for k in KINDS}
    by_round: dict = {k: {c: [] for c in args.concurrency} for k in KINDS}  # per round: (ttfp, ttft ratio)
    checks = {"max_abs_audio_diff_streamed_vs_whole": 0.0, "text_only_replies_differing_from_vllm": 0}

    async def batch(name: str, kind: str, requests: list[tuple[int, int]]) -> list[dict]:
        """One mode's requests (question index, clip seed), all at once."""
        if name in modes:
            jobs = (speech(modes[name], prompts.speech(kind, i, s), params) for i, s in requests)
        elif name == "text_only":
            jobs = (text_only(modes["streamed"], prompts.text_only(kind, i, s), params) for i, s in requests)
        else:
            jobs = (vllm_text(llm, prompts.text_only(kind, i, s), plain) for i, s in requests)
        return list(await asyncio.gather(*jobs))

    async def round_(r: int, c: int, kind: str, order: list[str]) -> None:
        got: dict[str, list[dict]] = {name: [] for name in names}
        reps = args.c1_repeats if c == 1 else 1  # more samples where one batch is one request
        for rep in range(reps):
            requests = [(rep * c + i, 1000 * (r + 2) + 100 * rep + 10 * c + i) for i in range(c)]  # a clip each
            for name in order if rep % 2 == 0 else order[::-1]:
                got[name] += await batch(name, kind, requests)
        for name in names:
            rows[kind][name][c].extend(got[name])
        for a, b in zip(got["streamed"], got["whole"]):
            diff = float(np.abs(a["audio"] - b["audio"]).max()) if a["audio"].shape == b["audio"].shape else np.inf
            checks["max_abs_audio_diff_streamed_vs_whole"] = max(checks["max_abs_audio_diff_streamed_vs_whole"], diff)
        checks["text_only_replies_differing_from_vllm"] += sum(
            a["text"] != b["text"] for a, b in zip(got["text_only"], got["vllm"])
        )
        by_round[kind][c].append(
            (median(got["streamed"], "ttfp"), median(got["text_only"], "ttft") / median(got["vllm"], "ttft"))
        )

    staggered: dict = {k: [] for k in KINDS}  # per round: the second request's TTFP

    async def staggered_round(r: int, kind: str) -> None:
        """The anchor's case: a second request arrives ``--stagger-s`` into another's speech (streamed engine)."""
        seeds = (1000 * (r + 2) + 900, 1000 * (r + 2) + 901)
        first = asyncio.ensure_future(speech(modes["streamed"], prompts.speech(kind, 0, seeds[0]), params))
        await asyncio.sleep(args.stagger_s)
        second = await speech(modes["streamed"], prompts.speech(kind, 1, seeds[1]), params)
        await first
        staggered[kind].append(second["ttfp"])

    try:
        for kind in KINDS:  # warm-up (first-request costs) outside the measurement
            await round_(-1, 1, kind, names)
        for kind in KINDS:
            for c in args.concurrency:
                by_round[kind][c].clear()
                for name in names:
                    rows[kind][name][c].clear()
        for r in range(args.rounds):
            order = names if r % 2 == 0 else list(reversed(names))
            for c in args.concurrency if r % 2 == 0 else list(reversed(args.concurrency)):
                for kind in KINDS if r % 2 == 0 else tuple(reversed(KINDS)):
                    await round_(r, c, kind, order)
            for kind in KINDS:
                await staggered_round(r, kind)
    finally:
        for engine in modes.values():
            await engine.shutdown()
        llm.shutdown()
    table = []
    for kind in KINDS:
        for c in args.concurrency:
            s, w, t, v = (rows[kind][m][c] for m in names)
            table.append(
                {
                    "kind": kind,
                    "concurrency": c,
                    "requests_per_mode": len(s),
                    "streamed_ttfp_ms": 1000 * median(s, "ttfp"),
                    "whole_ttfp_ms": 1000 * median(w, "ttfp"),
                    "ttfp_speedup": median(w, "ttfp") / median(s, "ttfp"),
                    "streamed_ttft_ms": 1000 * median(s, "ttft"),
                    "streamed_rtf": median(s, "rtf"),
                    "whole_rtf": median(w, "rtf"),
                    "streamed_e2e_ms": 1000 * median(s, "e2e"),
                    "whole_e2e_ms": 1000 * median(w, "e2e"),
                    "audio_duration_s": median(s, "audio_s"),
                    "text_only_ttft_ms": 1000 * median(t, "ttft"),
                    "vllm_ttft_ms": 1000 * median(v, "ttft"),
                    "text_only_ttft_ratio": median(t, "ttft") / median(v, "ttft"),
                    "text_only_ttft_ratio_rounds": spread([x for _, x in by_round[kind][c]]),
                }
            )
    growth = {}
    if 1 in args.concurrency and 4 in args.concurrency:
        for kind in KINDS:
            per_round = [a[0] / b[0] for a, b in zip(by_round[kind][4], by_round[kind][1])]
            pooled = median(rows[kind]["streamed"][4], "ttfp") / median(rows[kind]["streamed"][1], "ttfp")
            growth[kind] = {"pooled": pooled, **spread(per_round)}
    second = {}
    if 1 in args.concurrency:
        for kind in KINDS:
            per_round = [t / b[0] for t, b in zip(staggered[kind], by_round[kind][1])]
            second[kind] = {"ttfp_ms": 1000 * statistics.median(staggered[kind]), **spread(per_round)}
    return {
        "model": model,
        "rounds": args.rounds,
        "c1_repeats": args.c1_repeats,
        "chunk_frames": args.chunk_frames,
        "frames": args.frames,
        "text_tokens": args.text_tokens,
        "clip_s": CLIP_S,
        "engine_args": engine_args,
        "vllm_engine_args": {k: v for k, v in vllm_args.items() if k != "model"},
        **checks,
        "ttfp_growth_c4_over_c1": growth,
        "stagger_s": args.stagger_s,
        "second_request_ttfp_over_c1": second,
        "results": table,
    }


def write(report: dict, name: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    growth = report["ttfp_growth_c4_over_c1"]
    lines = [
        "# Qwen3-Omni streaming: TTFP under concurrency, async chunk vs whole, thinker TTFT vs plain vLLM (qwen_omni)",
        "",
        f"model: `{report['model']}` (vLLM's own thinker); {report['text_tokens']} reply tokens and "
        f"{report['frames']} codec frames per request, code2wav pieces of {report['chunk_frames']} frames after the "
        f"first; audio-in requests carry a {report['clip_s']:g} s clip (a chat with an `input_audio` part); engine "
        f"args {report['engine_args']}; medians over {report['rounds']} alternating rounds ({report['c1_repeats']} "
        "requests per mode and round at concurrency 1, one batch at 4). TTFP = submit -> first audio packet; "
        'RTF = end-to-end time / audio duration; text-only = `modalities: ["text"]` on the streamed engine vs '
        "the same thinker on a plain vLLM AsyncLLM in the same process (engine args "
        f"{report['vllm_engine_args']}), both given the same prompt (token ids for text-in; template text + "
        "`multi_modal_data` audio for audio-in).",
        f"Streamed and whole audio max |diff|: {report['max_abs_audio_diff_streamed_vs_whole']:.2e}; text-only "
        f"replies differing from vLLM's: {report['text_only_replies_differing_from_vllm']}.",
        "",
    ]
    for kind, g in growth.items():
        lines.append(
            f"- **{kind}-in streamed TTFP c=4 / c=1: {g['median']:.2f}** (per-round range "
            f"{g['min']:.2f}–{g['max']:.2f}; pooled medians {g['pooled']:.2f})."
        )
    for kind, g in report["second_request_ttfp_over_c1"].items():
        lines.append(
            f"- {kind}-in, a second request arriving {report['stagger_s']:g} s into another's speech: TTFP "
            f"{g['ttfp_ms']:.1f} ms, {g['median']:.2f}× c=1 (per-round range "
            f"{g['min']:.2f}–{g['max']:.2f})."
        )
    for r in report["results"]:
        s = r["text_only_ttft_ratio_rounds"]
        lines.append(
            f"- {r['kind']}-in text-only TTFT / plain vLLM at c={r['concurrency']}: {s['median']:.3f} "
            f"(per-round range {s['min']:.3f}–{s['max']:.3f})."
        )
    lines += [
        "",
        (
            "| in | concurrency | streamed TTFP ms | whole TTFP ms | TTFP speed-up | streamed TTFT ms | streamed RTF | "
            "whole RTF | audio s | text-only TTFT ms | vLLM TTFT ms | TTFT ratio |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['kind']} | {r['concurrency']} | {r['streamed_ttfp_ms']:.1f} | {r['whole_ttfp_ms']:.1f} | "
            f"{r['ttfp_speedup']:.2f}x | {r['streamed_ttft_ms']:.1f} | {r['streamed_rtf']:.3f} | "
            f"{r['whole_rtf']:.3f} | {r['audio_duration_s']:.2f} | {r['text_only_ttft_ms']:.1f} | "
            f"{r['vllm_ttft_ms']:.1f} | {r['text_only_ttft_ratio']:.3f} |"
        )
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a Qwen3-Omni folder (default: build the tiny fixture)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--chunk-frames", type=int, default=4)
    parser.add_argument("--frames", type=int, default=60, help="codec frames per request (12.5 per second)")
    parser.add_argument("--text-tokens", type=int, default=32, help="reply tokens per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--c1-repeats", type=int, default=3, help="requests per mode and round at concurrency 1")
    parser.add_argument(
        "--stagger-s",
        type=float,
        default=0.3,
        help="the staggered case: the second request starts this long after the first",
    )
    parser.add_argument("--name", default="omni_streaming", help="results file name (under benchmarks/results)")
    write(asyncio.run(main(parser.parse_args())), parser.parse_args().name)
