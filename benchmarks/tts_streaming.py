"""Streamed TTS: time to first audio packet with async chunk vs without.

The same codec_tts folder is served twice in one process: with async chunk
(the codec decodes a first block of ``initial_codec_chunk_frames``, then every
``chunk_frames``, while the LM generates) and without (the whole code sequence
is decoded after the LM finished). Both engines stay up and the two modes run
in alternating rounds, so load from other processes hits both alike. Per
request: ``audio_ttfp`` (submit -> first audio packet), end-to-end latency,
and ``audio_rtf`` (end-to-end time / audio duration). Reports medians per
mode, the issue's targets (whole TTFP / streamed TTFP >= 5 at concurrency 1;
streamed TTFP at the highest concurrency / at 1 <= 2) and how far the streamed
audio is from the whole decode (float rounding for a causal codec such as
Mimi; an approximation for a non-causal one such as XCodec2).

    python benchmarks/tts_streaming.py [--family codec_tts|llasa|csm|qwen3_tts | --model DIR] [--rounds 5]
        [--chunk-frames 8] [--initial-chunk-frames N] [--frames 200] [--concurrency 1 8]

Without --model the tiny fixture of --family is built (tiny LM and codec:
the ratios show the pipeline's scheduling, not a real model's compute).
Results: benchmarks/results/tts_streaming.{json,md} for codec_tts,
tts_streaming_<family>.{json,md} for the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

RESULTS = Path(__file__).parent / "results"
TEXTS = ["hello world", "good morning, how are you today?", "the quick brown fox jumps over the lazy dog",
         "i am fine, thank you."]


async def one(engine, text: str, lm: dict, codec: dict) -> dict:
    t0 = time.perf_counter()
    first = None
    audio = None
    async for out in engine.generate(text, sampling_params_list=[lm, codec]):
        if first is None and out.delta.get("audio") is not None:
            first = time.perf_counter()
        if out.finished:
            audio = out
    end = time.perf_counter()
    seconds = len(audio.audio) / audio.sample_rate
    return {"ttfp": first - t0, "e2e": end - t0, "audio_s": seconds, "rtf": (end - t0) / seconds, "audio": audio.audio}


async def batch(engine, n: int, lm: dict, codec: dict) -> list[dict]:
    return await asyncio.gather(*(one(engine, TEXTS[i % len(TEXTS)], lm, codec) for i in range(n)))


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


async def main(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from omnistage import AsyncOmni

    torch.set_num_threads(1)
    model = args.model
    if model is None and args.family == "qwen3_tts":  # its tiny checkpoints come from the reference package
        model = str(Path(__file__).resolve().parents[1] / "tests/models/qwen3_tts/tiny/custom_voice")
    elif model is None:
        from omnistage.testing.tiny import build

        model = str(build(args.family, tempfile.mkdtemp(prefix=f"omnistage-bench-{args.family}-")))
    engine_args = {"max_model_len": 8 * args.frames + 128, "dtype": "float32", "max_num_seqs": 8}
    modes = {
        "streamed": AsyncOmni(model, deploy_config={"async_chunk": True}, **engine_args),
        "whole": AsyncOmni(model, deploy_config={"async_chunk": False}, **engine_args),
    }
    for engine in modes.values():
        await engine.start()
    from omnistage.models.codec_tts.config import load_tts_config
    from omnistage.models.csm.config import is_csm

    from omnistage.models.qwen3_tts.config import INITIAL_CHUNK_FRAMES as QWEN3_TTS_FIRST
    from omnistage.models.qwen3_tts.config import is_qwen3_tts

    csm = is_csm(Path(model))
    qwen3_tts = is_qwen3_tts(Path(model))
    if csm:  # CSM's backbone stage counts frames (K codes each) and takes no repetition penalty / min_tokens
        lm = {"temperature": 0, "max_tokens": args.frames}
    elif qwen3_tts:  # the talker counts tokens: N make N - 1 frames
        lm = {"temperature": 0, "repetition_penalty": 1.0, "max_tokens": args.frames + 1, "min_tokens": args.frames + 1}
    else:
        tokens = args.frames * load_tts_config(model).num_quantizers  # K tokens per frame
        lm = {"temperature": 0, "repetition_penalty": 1.0, "max_tokens": tokens, "min_tokens": tokens}
    codec = {"chunk_frames": args.chunk_frames}
    if args.initial_chunk_frames is not None:
        codec["initial_codec_chunk_frames"] = args.initial_chunk_frames
    rows: dict[str, dict[int, list[dict]]] = {m: {c: [] for c in args.concurrency} for m in modes}
    max_diff, diff_sq, signal_sq = 0.0, 0.0, 0.0
    try:
        for name, engine in modes.items():  # warm-up (first-request costs) outside the measurement
            await batch(engine, 1, lm, codec)
        for r in range(args.rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for c in args.concurrency:
                got = {}
                for name in order:
                    got[name] = await batch(modes[name], c, lm, codec)
                    rows[name][c].extend(got[name])
                for a, b in zip(got["streamed"], got["whole"]):  # same text, greedy: the same codes
                    diff = np.asarray(a["audio"], np.float64) - np.asarray(b["audio"], np.float64)
                    max_diff = max(max_diff, float(np.abs(diff).max()))
                    diff_sq += float((diff ** 2).sum())
                    signal_sq += float((np.asarray(b["audio"], np.float64) ** 2).sum())
    finally:
        for engine in modes.values():
            await engine.shutdown()
    table = []
    low, high = min(args.concurrency), max(args.concurrency)
    for c in args.concurrency:
        s, w = rows["streamed"][c], rows["whole"][c]
        table.append({
            "concurrency": c,
            "streamed_ttfp_ms": 1000 * median(s, "ttfp"), "whole_ttfp_ms": 1000 * median(w, "ttfp"),
            "ttfp_ratio": median(s, "ttfp") / median(w, "ttfp"),
            "streamed_rtf": median(s, "rtf"), "whole_rtf": median(w, "rtf"),
            "rtf_ratio": median(s, "rtf") / median(w, "rtf"),
            "streamed_e2e_ms": 1000 * median(s, "e2e"), "whole_e2e_ms": 1000 * median(w, "e2e"),
            "audio_duration_s": median(s, "audio_s"), "requests_per_mode": len(s),
        })
    from omnistage.models.codec_tts.codec import codec_type

    by_c = {r["concurrency"]: r for r in table}
    ttfp_speedup = by_c[low]["whole_ttfp_ms"] / by_c[low]["streamed_ttfp_ms"]
    ttfp_growth = by_c[high]["streamed_ttfp_ms"] / by_c[low]["streamed_ttfp_ms"]
    return {"family": args.family if args.model is None else None, "model": model,
            "codec": "mimi" if csm else "qwen3_tts_12hz" if qwen3_tts else codec_type(Path(model) / "codec"),
            "rounds": args.rounds, "chunk_frames": args.chunk_frames,
            "initial_chunk_frames": args.initial_chunk_frames or (QWEN3_TTS_FIRST if qwen3_tts else
                                                                 load_tts_config(model).initial_chunk_frames)
            or args.chunk_frames, "frames": args.frames, "engine_args": engine_args,
            "max_abs_audio_diff_streamed_vs_whole": max_diff,
            "rms_audio_diff_over_rms_signal": (diff_sq / signal_sq) ** 0.5 if signal_sq else None,
            "targets": {"whole_over_streamed_ttfp_at_c%d" % low: ttfp_speedup, "target_speedup": 5.0,
                        "speedup_met": ttfp_speedup >= 5.0,
                        "streamed_ttfp_c%d_over_c%d" % (high, low): ttfp_growth, "target_growth": 2.0,
                        "growth_met": ttfp_growth <= 2.0},
            "results": table}


def write(report: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = report["family"] or Path(report["model"]).name
    stem = "tts_streaming" if name == "codec_tts" else f"tts_streaming_{name}"
    (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    t = report["targets"]
    speedup_key = next(k for k in t if k.startswith("whole_over"))
    growth_key = next(k for k in t if k.startswith("streamed_ttfp"))
    lines = [
        f"# Streamed TTS: async chunk vs whole-sequence decode ({report['family'] or 'codec_tts'}, "
        f"{report['codec']} codec)",
        "",
        f"model: `{report['model']}`; {report['frames']} codec frames per request, streamed in a first block of "
        f"{report['initial_chunk_frames']} frames, "
        f"then {report['chunk_frames']}; engine args {report['engine_args']}; medians over {report['rounds']} "
        "alternating rounds. audio_ttfp = submit -> first audio packet; audio_rtf = end-to-end time / audio duration.",
        f"Streamed vs whole audio: max |diff| {report['max_abs_audio_diff_streamed_vs_whole']:.2e}, "
        f"RMS(diff) / RMS(audio) {report['rms_audio_diff_over_rms_signal']:.2e}.",
        f"Targets: whole / streamed TTFP ({speedup_key}) {t[speedup_key]:.1f}x (target >= 5x: "
        f"{'met' if t['speedup_met'] else 'MISSED'}); {growth_key} {t[growth_key]:.2f}x (target <= 2x: "
        f"{'met' if t['growth_met'] else 'MISSED'}).",
        "",
        "| concurrency | streamed TTFP ms | whole TTFP ms | TTFP ratio | streamed RTF | whole RTF | RTF ratio | "
        "streamed e2e ms | whole e2e ms | audio s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(f"| {r['concurrency']} | {r['streamed_ttfp_ms']:.1f} | {r['whole_ttfp_ms']:.1f} | "
                     f"{r['ttfp_ratio']:.3f} | {r['streamed_rtf']:.3f} | {r['whole_rtf']:.3f} | {r['rtf_ratio']:.3f} | "
                     f"{r['streamed_e2e_ms']:.1f} | {r['whole_e2e_ms']:.1f} | {r['audio_duration_s']:.2f} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="codec_tts", choices=["codec_tts", "llasa", "csm", "qwen3_tts"],
                        help="tiny fixture to build when --model is not given")
    parser.add_argument("--model", default=None,
                        help="a codec_tts or CSM folder (default: build the tiny --family fixture)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunk-frames", type=int, default=8)
    parser.add_argument("--initial-chunk-frames", type=int, default=None,
                        help="frames of the first streamed block (default: the folder's)")
    parser.add_argument("--frames", type=int, default=200, help="codec frames generated per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    write(asyncio.run(main(parser.parse_args())))
