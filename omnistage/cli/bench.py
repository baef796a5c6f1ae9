"""``omnistage bench serve``: load an OpenAI-compatible server and report its metrics (throughput, latency percentiles, TTFT/TPOT; ``bench realtime``:
cli/bench_realtime.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from pathlib import Path

from omnistage.bench.datasets import TASKS
from omnistage.cli.args import positive_float, positive_int


def _rate(value: str) -> float:
    if value.lower() in ("inf", "infinity"):
        return math.inf
    rate = float(value)
    if rate <= 0:
        raise argparse.ArgumentTypeError("--request-rate must be positive or 'inf'")
    return rate


def add_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from omnistage.cli.bench_realtime import add_realtime_parser

    add_realtime_parser(bench_sub)
    p = bench_sub.add_parser("serve", help="serving benchmark against a running server")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default=None, help="request path (default per task, e.g. /v1/images/generations)")
    p.add_argument("--model", default=None, help="model name to send (default: first of GET /v1/models)")
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--dataset", default="random", choices=["random", "custom"])
    p.add_argument("--dataset-path", default=None, help="JSONL file for --dataset custom")
    p.add_argument("--num-prompts", type=positive_int, default=10)
    p.add_argument("--max-concurrency", type=positive_int, default=None)
    p.add_argument("--request-rate", type=_rate, default=math.inf, help="requests/s (Poisson) or inf")
    p.add_argument("--width", type=positive_int, default=None)
    p.add_argument("--height", type=positive_int, default=None)
    p.add_argument("--num-frames", type=positive_int, default=None)
    p.add_argument("--fps", type=positive_int, default=None)
    p.add_argument("--num-inference-steps", type=positive_int, default=None)
    p.add_argument("--guidance-scale", type=float, default=None)
    p.add_argument("--strength", type=float, default=None, help="i2i / i2v strength")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--random-input-len", type=positive_int, default=16, help="chat: words per random prompt")
    p.add_argument(
        "--chat-image",
        action="store_true",
        help="chat: each request carries a seeded random PNG (--width x --height, default 64x64)",
    )
    p.add_argument(
        "--chat-audio",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="chat / omni / asr: each request carries a seeded WAV clip this long (chat / omni: an "
        "input_audio part, e.g. Qwen3-Omni hearing its question; asr: the uploaded file, 5 s "
        "by default)",
    )
    p.add_argument(
        "--output-len",
        "--max-tokens",
        dest="max_tokens",
        type=positive_int,
        default=None,
        help="chat: max_tokens per request",
    )
    p.add_argument("--no-ignore-eos", action="store_true", help="chat: let requests stop at EOS")
    p.add_argument("--temperature", type=float, default=0.0, help="chat sampling temperature")
    p.add_argument("--voice", default=None, help="tts voice")
    p.add_argument("--stream", action="store_true", help="tts: stream PCM (measures time to first packet)")
    p.add_argument("--audio-format", default="wav")
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--warmup-num-inference-steps", type=positive_int, default=2)
    p.add_argument("--slo", type=float, default=None, help="latency SLO in seconds")
    p.add_argument(
        "--slo-scale",
        type=float,
        default=3.0,
        help="without --slo: SLO = scale x latency of one request run alone (0 disables)",
    )
    p.add_argument("--return-stage-metrics", action="store_true")
    p.add_argument("--save-dir", default=None, help="decode and save returned images/audio/video here")
    p.add_argument("--output-file", default=None, help="write metrics + per-request results as JSON")
    p.add_argument("--plot-file", default=None, help="latency PNG (default: next to --output-file)")
    p.add_argument("--no-plot", action="store_true", help="skip the latency PNG")
    p.add_argument("--label", default=None, help="name recorded in the JSON (e.g. omnistage, naive)")
    p.add_argument("--ready-timeout", type=float, default=0.0, help="wait up to N s for GET /health")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--disable-tqdm", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.bench_command == "realtime":
        from omnistage.cli.bench_realtime import run_realtime

        return run_realtime(args)
    from omnistage.bench.datasets import DatasetDefaults, load_dataset
    from omnistage.bench.metrics import aggregate
    from omnistage.bench.report import (
        format_table,
        plot_latency,
        save_outputs,
        write_json,
    )
    from omnistage.bench.request_funcs import ClientSpec
    from omnistage.bench.runner import RunConfig, run_benchmark

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request drowns the table
    if args.ready_timeout > 0 and not _wait_ready(args.base_url, args.ready_timeout):
        print(f"server at {args.base_url} not ready after {args.ready_timeout}s", file=sys.stderr)
        return 1
    try:
        defaults = DatasetDefaults(
            width=args.width,
            height=args.height,
            num_frames=args.num_frames,
            num_inference_steps=args.num_inference_steps,
            guidance_scale=args.guidance_scale,
            seed=args.seed,
            max_tokens=args.max_tokens,
            voice=args.voice,
            input_len=args.random_input_len,
            chat_image=args.chat_image,
            chat_audio_s=args.chat_audio,
        )
        requests = load_dataset(args.dataset, args.task, args.num_prompts, defaults, args.dataset_path)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = args.model or _first_model(args.base_url)
    spec = ClientSpec(
        base_url=args.base_url,
        task=args.task,
        endpoint=args.endpoint,
        model=model,
        return_stage_metrics=args.return_stage_metrics,
        stream=args.stream,
        audio_format=args.audio_format,
        fps=args.fps,
        strength=args.strength,
        temperature=args.temperature,
        ignore_eos=not args.no_ignore_eos,
    )
    cfg = RunConfig(
        request_rate=args.request_rate,
        max_concurrency=args.max_concurrency,
        warmup_requests=args.warmup_requests,
        warmup_num_inference_steps=args.warmup_num_inference_steps,
        slo_s=args.slo,
        slo_scale=args.slo_scale,
        seed=args.seed,
        request_timeout_s=args.request_timeout,
        progress=not args.disable_tqdm,
    )
    result = asyncio.run(run_benchmark(spec, requests, cfg))
    metrics = aggregate([o.result for o in result.outcomes], result.duration, result.slo_s)
    print(format_table(metrics))
    errors = sorted({o.result.error for o in result.outcomes if not o.result.success})
    for err in errors[:5]:
        print(f"failed request: {err}", file=sys.stderr)
    config = {k: v for k, v in vars(args).items() if k not in ("func",)}
    config.update(model=model, endpoint=spec.url, request_rate=str(args.request_rate))
    if args.output_file:
        extra = {
            "label": args.label,
            "slo_reference_latency": result.slo_reference_latency,
            "warmup_errors": result.warmup_errors,
        }
        path = write_json(args.output_file, config, metrics, result.outcomes, extra)
        print(f"wrote {path}")
    plot_path = args.plot_file or (str(Path(args.output_file).with_suffix(".png")) if args.output_file else None)
    if (
        plot_path
        and not args.no_plot
        and plot_latency(plot_path, result.outcomes, f"{args.label or model} {args.task}")
    ):
        print(f"wrote {plot_path}")
    if args.save_dir:
        print(f"saved {save_outputs(args.save_dir, result.outcomes)} files to {args.save_dir}")
    return 0 if metrics["completed_requests"] > 0 else 1


def _first_model(base_url: str) -> str | None:
    import httpx

    try:
        data = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=10).json()
        return data["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, json.JSONDecodeError):
        return None


def _wait_ready(base_url: str, timeout: float) -> bool:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(base_url.rstrip("/") + "/health", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    return False
