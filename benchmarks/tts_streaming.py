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

VibeVoice is one stage (its LM step decodes its own frame: there is no codec stage to stream to, and
async chunk is refused for a one-stage pipeline), so it is served once: "streamed" is the first audio
delta (one per frame), "whole" is the complete answer of the same request (what a non-streamed request
waits for), and streamed vs whole compares the concatenated deltas with the final audio. ``--frames``
caps its LM steps (``max_tokens``; the tiny model also ends itself), 40 by default.

    python benchmarks/tts_streaming.py [--family codec_tts|llasa|csm|qwen3_tts|vibevoice|higgs_audio|voxcpm|xtts
        | --model DIR] [--rounds 5] [--chunk-frames 8] [--initial-chunk-frames N] [--frames 200]
        [--concurrency 1 8] [--out benchmarks/results]

VoxCPM2's LM caps its steps at 6 per text token + 10 (22 for "hello world"): run it with ``--frames 20`` so
that every request makes them all (as its recorded results did). The tiny XTTS v2 makes at most 27 codes a
request (its ``gpt_max_audio_tokens`` less 3): ``--frames 24``.

A pipeline that declares it has no voice of its own (``SpeechInfo.needs_voice``) gets a reference clip with every
request (a second of tone and noise, the same for all: a family that caches a clip's conditioning computes it once,
in the warm-up).

The requests' LM parameters (how many tokens make ``--frames`` frames, what makes them repeatable) and the
first streamed block come from the pipeline's declared ``SpeechInfo.frames`` (``omnistage/info.py``).
Without --model the tiny fixture of --family is built (tiny LM and codec:
the ratios show the pipeline's scheduling, not a real model's compute).
Results: OUT/tts_streaming.{json,md} for codec_tts, tts_streaming_<family>.{json,md} for the others (OUT:
``--out``, benchmarks/results by default).
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

sys.path.insert(0, str(Path(__file__).parent))
from speech_fixtures import declared, tiny_folder  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DEFAULT = "codec_tts"  # the tiny fixture served without --family (its results keep the unsuffixed name)
TEXTS = [
    "hello world",
    "good morning, how are you today?",
    "the quick brown fox jumps over the lazy dog",
    "i am fine, thank you.",
]


def reference_clip(seconds: float = 1.2, rate: int = 16000) -> tuple:
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    audio = 0.2 * np.sin(2 * np.pi * 220 * t) + 0.05 * np.random.default_rng(1).standard_normal(t.size)
    return audio.astype(np.float32), rate


async def one(engine, text: str, params: list[dict], voice: tuple | None = None) -> dict:
    t0 = time.perf_counter()
    first = None
    audio = None
    deltas = []
    prompt = text if voice is None else {"prompt": text, "speech": {"ref_audio": voice}}
    async for out in engine.generate(prompt, sampling_params_list=params):
        if not out.finished and out.delta.get("audio") is not None:
            first = first or time.perf_counter()
            deltas.append(out.delta["audio"])
        if out.finished:
            audio = out
    end = time.perf_counter()
    seconds = len(audio.audio) / audio.sample_rate
    return {
        "ttfp": first - t0,
        "e2e": end - t0,
        "audio_s": seconds,
        "rtf": (end - t0) / seconds,
        "audio": audio.audio,
        "deltas": deltas,
    }


async def batch(engine, n: int, params: list[dict], voice: tuple | None = None) -> list[dict]:
    return await asyncio.gather(*(one(engine, TEXTS[i % len(TEXTS)], params, voice) for i in range(n)))


def as_whole(rows: list[dict]) -> list[dict]:
    """A one-stage pipeline's requests as a non-streamed client sees them: the first audio is the whole answer."""
    return [{**r, "ttfp": r["e2e"], "audio": r["audio"]} for r in rows]


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def summary_row(c: int, s: list[dict], w: list[dict]) -> dict:
    """Medians of the streamed (``s``) and whole (``w``) requests at concurrency ``c``."""
    return {
        "concurrency": c,
        "streamed_ttfp_ms": 1000 * median(s, "ttfp"),
        "whole_ttfp_ms": 1000 * median(w, "ttfp"),
        "ttfp_ratio": median(s, "ttfp") / median(w, "ttfp"),
        "streamed_rtf": median(s, "rtf"),
        "whole_rtf": median(w, "rtf"),
        "rtf_ratio": median(s, "rtf") / median(w, "rtf"),
        "streamed_e2e_ms": 1000 * median(s, "e2e"),
        "whole_e2e_ms": 1000 * median(w, "e2e"),
        "audio_duration_s": median(s, "audio_s"),
        "requests_per_mode": len(s),
    }


async def main(args: argparse.Namespace) -> dict:
    import numpy as np
    import torch

    from omnistage import AsyncOmni

    torch.set_num_threads(1)
    model = args.model
    if model is None:  # requests name no voice: a fixture that speaks without a clip
        model = str(
            tiny_folder(args.family, Path(tempfile.mkdtemp(prefix=f"omnistage-bench-{args.family}-")), clones=False)
        )
    pipeline = declared(model)
    code = pipeline.info.speaks.frames
    one_stage = len(pipeline.stages) == 1  # its LM stage decodes its own frames: no codec stage to stream to
    if args.frames is None:
        args.frames = 40 if one_stage else 200
    engine_args = {"max_model_len": 8 * args.frames + 128, "dtype": "float32", "max_num_seqs": 8}
    if one_stage:  # one engine: streamed and whole are the same requests (see the docstring)
        modes = {"streamed": AsyncOmni(model, **engine_args)}
    else:
        modes = {
            "streamed": AsyncOmni(model, deploy_config={"async_chunk": True}, **engine_args),
            "whole": AsyncOmni(model, deploy_config={"async_chunk": False}, **engine_args),
        }
    for engine in modes.values():
        await engine.start()
    lm = {**code.repeatable, "max_tokens": code.lm_tokens(args.frames)}
    if code.takes_min_tokens:
        lm["min_tokens"] = lm["max_tokens"]
    codec = {"chunk_frames": args.chunk_frames}
    if args.initial_chunk_frames is not None:
        codec["initial_codec_chunk_frames"] = args.initial_chunk_frames
    params = [lm] if one_stage else [lm, codec]
    voice = reference_clip() if pipeline.info.speaks.needs_voice else None
    rows: dict[str, dict[int, list[dict]]] = {m: {c: [] for c in args.concurrency} for m in ("streamed", "whole")}
    max_diff, diff_sq, signal_sq = 0.0, 0.0, 0.0
    frames_seen: list[int] = []
    try:
        for name, engine in modes.items():  # warm-up (first-request costs) outside the measurement
            await batch(engine, 1, params, voice)
        for r in range(args.rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for c in args.concurrency:
                got = {}
                for name in order:
                    got[name] = await batch(modes[name], c, params, voice)
                    rows[name][c].extend(got[name])
                if one_stage:
                    got["whole"] = as_whole(got["streamed"])
                    rows["whole"][c].extend(got["whole"])
                    frames_seen.extend(len(x["deltas"]) for x in got["streamed"])
                for a, b in zip(got["streamed"], got["whole"]):  # same text, greedy: the same codes
                    streamed = np.concatenate(a["deltas"]) if one_stage else a["audio"]
                    diff = np.asarray(streamed, np.float64) - np.asarray(b["audio"], np.float64)
                    max_diff = max(max_diff, float(np.abs(diff).max()))
                    diff_sq += float((diff**2).sum())
                    signal_sq += float((np.asarray(b["audio"], np.float64) ** 2).sum())
    finally:
        for engine in modes.values():
            await engine.shutdown()
    table = [summary_row(c, rows["streamed"][c], rows["whole"][c]) for c in args.concurrency]
    low, high = min(args.concurrency), max(args.concurrency)
    by_c = {r["concurrency"]: r for r in table}
    ttfp_speedup = by_c[low]["whole_ttfp_ms"] / by_c[low]["streamed_ttfp_ms"]
    ttfp_growth = by_c[high]["streamed_ttfp_ms"] / by_c[low]["streamed_ttfp_ms"]
    if one_stage:
        first, chunk = 1, 1  # every frame is a delta
    else:
        first = args.initial_chunk_frames or code.initial_chunk_frames or args.chunk_frames
        chunk = args.chunk_frames
    return {
        "family": args.family if args.model is None else None,
        "model": model,
        "codec": code.codec,
        "one_stage": one_stage,
        "frames_per_request": statistics.median(frames_seen) if frames_seen else None,
        "rounds": args.rounds,
        "chunk_frames": chunk,
        "initial_chunk_frames": first,
        "frames": args.frames,
        "engine_args": engine_args,
        "max_abs_audio_diff_streamed_vs_whole": max_diff,
        "rms_audio_diff_over_rms_signal": (diff_sq / signal_sq) ** 0.5 if signal_sq else None,
        "targets": {
            "whole_over_streamed_ttfp_at_c%d" % low: ttfp_speedup,
            "target_speedup": 5.0,
            "speedup_met": ttfp_speedup >= 5.0,
            "streamed_ttfp_c%d_over_c%d" % (high, low): ttfp_growth,
            "target_growth": 2.0,
            "growth_met": ttfp_growth <= 2.0,
        },
        "results": table,
    }


def write(report: dict, out: Path = RESULTS) -> None:
    out.mkdir(parents=True, exist_ok=True)
    name = report["family"] or Path(report["model"]).name
    stem = "tts_streaming" if name == DEFAULT else f"tts_streaming_{name}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    t = report["targets"]
    speedup_key = next(k for k in t if k.startswith("whole_over"))
    growth_key = next(k for k in t if k.startswith("streamed_ttfp"))
    codec = f"{report['codec']} codec"
    if report.get("one_stage"):
        title, codec = "first audio delta vs the complete answer", f"{codec} run inside the LM stage"
        frames = (
            f"at most {report['frames']} LM steps per request ({report['frames_per_request']:g} frames spoken, "
            "median), every frame its own delta; streamed and whole are the same requests (one stage: no "
            "async chunk)"
        )
    else:
        title = "async chunk vs whole-sequence decode"
        frames = (
            f"{report['frames']} codec frames per request, streamed in a first block of "
            f"{report['initial_chunk_frames']} frames, then {report['chunk_frames']}"
        )
    lines = [
        f"# Streamed TTS: {title} ({report['family'] or DEFAULT}, {codec})",
        "",
        f"model: `{report['model']}`; {frames}; engine args {report['engine_args']}; medians over {report['rounds']} "
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
        lines.append(
            f"| {r['concurrency']} | {r['streamed_ttfp_ms']:.1f} | {r['whole_ttfp_ms']:.1f} | "
            f"{r['ttfp_ratio']:.3f} | {r['streamed_rtf']:.3f} | {r['whole_rtf']:.3f} | {r['rtf_ratio']:.3f} | "
            f"{r['streamed_e2e_ms']:.1f} | {r['whole_e2e_ms']:.1f} | {r['audio_duration_s']:.3g} |"
        )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--family",
        default=DEFAULT,
        choices=[DEFAULT, "llasa", "csm", "qwen3_tts", "vibevoice", "higgs_audio", "voxcpm", "xtts"],
        help="tiny fixture to build when --model is not given",
    )
    parser.add_argument(
        "--model", default=None, help="a codec_tts or CSM folder (default: build the tiny --family fixture)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunk-frames", type=int, default=8)
    parser.add_argument(
        "--initial-chunk-frames",
        type=int,
        default=None,
        help="frames of the first streamed block (default: the folder's)",
    )
    parser.add_argument(
        "--frames",
        type=int,
        default=None,
        help="codec frames generated per request (default 200; VibeVoice: LM steps, default 40, "
        "of which the tiny model speaks ~18 frames)",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results go (default: %(default)s)")
    cli = parser.parse_args()
    write(asyncio.run(main(cli)), cli.out)
