"""``omnistage bench realtime``: spoken sessions over /v1/realtime at concurrency 1..N (omnistage/bench/realtime.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from omnistage.cli.args import positive_float, positive_int


def _levels(value: str) -> list[int]:
    try:
        levels = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--concurrency: comma-separated integers, got {value!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"--concurrency: each level must be >= 1, got {value!r}")
    return levels


def _session(value: str) -> dict:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--session: not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError("--session: a JSON object of session.update fields")
    return obj


def add_realtime_parser(bench_sub: argparse._SubParsersAction) -> None:
    p = bench_sub.add_parser("realtime", help="spoken sessions over /v1/realtime: first audio, RTF, barge-in")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name (?model=...; default: the server's)")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer'")
    p.add_argument("--concurrency", type=_levels, default=[1, 2, 4], help="levels, e.g. 1,2,4 (default)")
    p.add_argument("--turns", type=positive_int, default=2, help="spoken turns per session (default 2)")
    p.add_argument("--no-barge-in", action="store_true", help="skip the turn cancelled on its first audio delta")
    p.add_argument(
        "--turn-detection",
        choices=["manual", "server_vad"],
        default="manual",
        help="manual: commit after the utterance; server_vad: the server finds the turn",
    )
    p.add_argument("--audio", default=None, help="WAV/FLAC utterance to stream (default: a synthetic speech-like one)")
    p.add_argument("--speech-seconds", type=positive_float, default=1.5, help="length of the synthetic utterance")
    p.add_argument("--rate", type=positive_int, default=16000, help="sample rate of the synthetic utterance")
    p.add_argument(
        "--session",
        type=_session,
        default={},
        help="extra session.update fields as JSON, e.g. "
        '\'{"max_output_tokens": 32, "extra_body": {"temperature": 0}}\'',
    )
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the baseline (the same audio turn as streamed /v1/chat/completions requests)",
    )
    p.add_argument("--output-file", default=None, help="JSON results (a Markdown table goes next to it)")
    p.add_argument("--label", default=None, help="title of the Markdown table")
    p.add_argument("--request-timeout", type=positive_float, default=300.0, help="s to wait for any one event")


def _clip(args: argparse.Namespace):
    from omnistage.bench.utterance import utterance

    if args.audio is None:
        after = 1.0 if args.turn_detection == "server_vad" else 0.1  # VAD needs the silence to end the turn
        clip, _ = utterance(args.speech_seconds, args.rate, after_s=after)
        return clip, args.rate
    import soundfile

    x, rate = soundfile.read(args.audio, dtype="float32", always_2d=True)
    return x.mean(axis=1), rate


def run_realtime(args: argparse.Namespace) -> int:
    from omnistage.bench.realtime import RealtimeConfig, markdown, run_level

    try:
        clip, rate = _clip(args)
    except (OSError, RuntimeError, ValueError) as e:
        print(f"error: --audio: {e}", file=sys.stderr)
        return 2
    url = args.base_url.rstrip("/").replace("http://", "ws://").replace("https://", "wss://") + "/v1/realtime"
    if args.model:
        url += f"?model={args.model}"
    cfg = RealtimeConfig(
        url=url,
        clip=clip,
        rate=rate,
        api_key=args.api_key,
        turns=args.turns,
        barge_in=not args.no_barge_in,
        server_vad=args.turn_detection == "server_vad",
        session=args.session,
        timeout_s=args.request_timeout,
    )
    levels = []
    for c in args.concurrency:
        baseline = None if args.no_baseline or args.turn_detection == "server_vad" else args.base_url
        level = asyncio.run(run_level(cfg, c, baseline, args.model))
        levels.append(level)
        fa = level["first_audio_s"]
        print(
            f"c={c}: {level['turns_answered']}/{level['turns']} turns, first audio median {fa['median'] * 1000:.0f} ms"
            if fa
            else f"c={c}: no audio; failed: {level['failed_sessions'][:1]}"
        )
    title = args.label or f"omnistage bench realtime ({args.turn_detection}, {len(clip) / rate:.2f} s utterance)"
    table = markdown(levels, title)
    print(table)
    if args.output_file:
        out = Path(args.output_file)
        out.parent.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in vars(args).items() if k != "func"}
        config.update(utterance_s=len(clip) / rate, utterance_rate=rate)
        out.write_text(json.dumps({"config": config, "levels": levels}, indent=2, default=str))
        out.with_suffix(".md").write_text(table)
        print(f"wrote {out} and {out.with_suffix('.md')}")
    ok = all(not lv["failed_sessions"] and lv["turns_answered"] == lv["turns"] for lv in levels)
    return 0 if ok else 1
