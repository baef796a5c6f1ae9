"""The flags of ``omnistage serve``: the engine's (stage deploy fields), media inputs, per-request limits,
LoRA adapters, realtime sessions, and where async jobs live."""

from __future__ import annotations

import argparse
import os

from omnistage.cli.args import positive_float, positive_int
from omnistage.cli.uvicorn_server import STOP_STAGES_S
from omnistage.limits import DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_INFERENCE_STEPS, DEFAULT_MAX_NUM_FRAMES


def add_flags(p: argparse.ArgumentParser) -> None:
    """Every flag of ``omnistage serve``."""
    p.add_argument("model", nargs="?", help="local model folder (default: the built-in demo)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s, every interface)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    p.add_argument(
        "--served-model-name",
        nargs="+",
        help="name(s) clients send as 'model', as vllm serve takes them (--served-model-name a b): each is "
        "answered to and listed, the first names the responses (default: omnistage-demo for the built-in demo, "
        "else the model folder's name)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("OMNISTAGE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1/* (or set OMNISTAGE_API_KEY)",
    )
    cfg = p.add_mutually_exclusive_group()
    cfg.add_argument("--deploy-config", metavar="FILE", help="deploy YAML")
    cfg.add_argument("--stage-configs-path", metavar="FILE", help="deploy YAML (legacy name)")
    p.add_argument("--stage-overrides", metavar="JSON", help='per-stage fields, e.g. \'{"0": {"max_num_seqs": 4}}\'')
    p.add_argument("--pipeline", help="force a registered pipeline (see `omnistage pipelines`)")
    p.add_argument("--max-num-seqs", type=positive_int, help="max requests batched per stage")
    p.add_argument("--enforce-eager", action="store_true", default=None, help="no CUDA graphs / compilation")
    p.add_argument("--trust-remote-code", action="store_true", default=None)
    p.add_argument("--distributed-executor-backend", choices=["mp", "ray"])
    _add_media_args(p)
    _add_limit_args(p)
    _add_lora_args(p)
    _add_realtime_args(p)
    p.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="memory of each device (e.g. 80GiB; default: the GPU's): a deploy that does not fit is refused "
        "before any engine starts (omnistage plan prints the numbers)",
    )
    # Where async jobs and their outputs live (docs/fleet.md); also OMNISTAGE_SERVER_JOB_STORE / _MEDIA_STORE
    p.add_argument(
        "--job-store",
        metavar="URL",
        help="async jobs: sqlite:///path (default: .jobs.sqlite3 under the storage path; one machine) or "
        "redis://host:port/db (front-ends on many machines share it)",
    )
    p.add_argument(
        "--media-store",
        metavar="URL",
        help="their outputs: file:///path (default: the storage path) or s3://bucket/prefix (endpoint and "
        "credentials from the AWS environment variables)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _add_media_args(p: argparse.ArgumentParser) -> None:
    """Media inputs: where they may come from and how large they may be."""
    p.add_argument("--allowed-local-media-path", metavar="DIR", help="allow file:// media URLs under DIR")
    p.add_argument(
        "--limit-mm-per-prompt",
        metavar="JSON",
        help='media items per prompt for llm stages (vLLM\'s flag), e.g. \'{"image": 2, "video": 0}\'',
    )
    p.add_argument(
        "--max-pending", type=positive_int, help="requests in flight at once; more are answered 503 with Retry-After"
    )
    p.add_argument(
        "--max-upload-mb",
        type=float,
        default=20.0,
        help="largest uploaded or inline media input (multipart file, data: URL, base64, file://)",
    )
    # Media fetched from http(s) URLs (vLLM's --allowed-media-domains; see docs/server.md)
    p.add_argument(
        "--allowed-media-domains",
        nargs="+",
        metavar="HOST",
        help="only fetch http(s) media from these hosts (exact names; default: any host)",
    )
    p.add_argument(
        "--max-download-mb",
        type=float,
        default=20.0,
        help="largest media input fetched from a URL (default: %(default)s)",
    )
    p.add_argument(
        "--media-fetch-timeout",
        type=float,
        default=10.0,
        help="seconds one media download may take, start to end (default: %(default)s)",
    )
    p.add_argument(
        "--max-audio-seconds",
        type=positive_float,
        default=3600.0,
        help="duration of one input audio, from its header and while decoding; a model may accept less "
        "(default: %(default)s)",
    )


def _add_limit_args(p: argparse.ArgumentParser) -> None:
    """Per-request caps, checked before any model work (400 naming the field), and request lifetimes."""
    p.add_argument(
        "--max-image-pixels",
        type=positive_int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="height x width of one generated image or video frame, and of an input image (default: %(default)s)",
    )
    p.add_argument(
        "--max-num-frames",
        type=positive_int,
        default=DEFAULT_MAX_NUM_FRAMES,
        help="frames of one generated or input video (default: %(default)s)",
    )
    p.add_argument(
        "--max-inference-steps",
        type=positive_int,
        default=DEFAULT_MAX_INFERENCE_STEPS,
        help="denoising steps of one request (default: %(default)s)",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        help="tokens one request may ask an llm stage for (default: the model's context length)",
    )
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        metavar="SECONDS",
        help="abort a request (or video job) still running after this long (504; default: none)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish on SIGTERM / Ctrl-C; the process exits at most "
        f"{STOP_STAGES_S:.0f} s after that, whatever it was doing (default: %(default)s)",
    )


def _add_lora_args(p: argparse.ArgumentParser) -> None:
    """LoRA adapters (vLLM's flags): loaded into the pipeline's diffusion stages, else its llm stages."""
    p.add_argument(
        "--lora-modules",
        nargs="+",
        metavar="NAME=PATH",
        help="LoRA adapters to serve, selected by model=NAME: name=path or a JSON object "
        '{"name", "path", "base_model_name"} (diffusers-format files for diffusion stages, '
        "PEFT adapters for llm stages)",
    )
    p.add_argument("--enable-lora", action="store_true", help="take LoRA adapters (implied by --lora-modules)")
    p.add_argument(
        "--max-loras",
        type=positive_int,
        help="adapters resident at once (diffusion default: max(4, number of --lora-modules); "
        "llm stages: vLLM's max_loras, per batch)",
    )
    p.add_argument("--max-lora-rank", type=positive_int, help="largest adapter rank accepted (default: 16)")
    p.add_argument(
        "--allow-runtime-lora-updating",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING; local development)",
    )


def _add_realtime_args(p: argparse.ArgumentParser) -> None:
    """/v1/realtime (WebSocket sessions)."""
    p.add_argument(
        "--max-realtime-sessions",
        type=positive_int,
        help="realtime sessions open at once; more are refused (close code 1013; default: no cap)",
    )
    p.add_argument(
        "--realtime-max-audio-seconds",
        type=positive_float,
        default=120.0,
        help="uncommitted input audio one realtime session may buffer (default: %(default)s)",
    )
    p.add_argument(
        "--realtime-idle-timeout",
        type=positive_float,
        metavar="SECONDS",
        help="close a realtime session that sends no event for this long (default: none)",
    )
    p.add_argument(
        "--duplex-resume-grace",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="a duplex session whose socket dropped keeps its state this long for session.resume (default: 30)",
    )
    p.add_argument(
        "--duplex-frame-budget-ms",
        type=positive_float,
        default=80.0,
        help="admit a duplex session only while a step of every live session stays within 80%% of this "
        "(default: %(default)s, one 80 ms frame)",
    )
    p.add_argument(
        "--realtime-max-session-seconds",
        type=positive_float,
        metavar="SECONDS",
        help="close a realtime session open this long (default: none)",
    )
