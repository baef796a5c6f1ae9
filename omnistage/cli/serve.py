"""``omnistage serve [MODEL]``: the OpenAI-compatible HTTP server (uvicorn + FastAPI).

With no MODEL the built-in demo pipeline is served. Engine flags become
stage deploy fields (CLI > --stage-overrides > deploy YAML > pipeline defaults).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from omnistage.cli.args import positive_float, positive_int
from omnistage.limits import DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_INFERENCE_STEPS, DEFAULT_MAX_NUM_FRAMES

logger = logging.getLogger("omnistage.serve")

# After --shutdown-timeout, what stopping the stages may take before the process exits regardless (its child
# processes end with it: stages/lifetime.py): the requests still running get 5 s to abort and answer their 503
# (server/drain.py), an mp child 10 s to stop before it is terminated.
STOP_STAGES_S = 20.0
# Once the app has drained its requests, what the connections get to close (their answers are sent).
DRAINED_CLOSE_S = 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve a pipeline behind an OpenAI-compatible HTTP API", description=__doc__.splitlines()[0]
    )
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


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The AsyncOmni(...) arguments the flags ask for."""
    kwargs: dict[str, Any] = {"pipeline": args.pipeline}
    deploy = args.deploy_config or args.stage_configs_path
    if args.distributed_executor_backend:
        # A top-level deploy field: layered over the YAML (if any) through base_config.
        overlay: dict[str, Any] = {"distributed_executor_backend": args.distributed_executor_backend}
        if deploy:
            overlay["base_config"] = str(Path(deploy).resolve())
        deploy = overlay
    kwargs["deploy_config"] = deploy
    if args.stage_overrides:
        try:
            kwargs["stage_overrides"] = json.loads(args.stage_overrides)
        except json.JSONDecodeError as e:
            raise ValueError(f"--stage-overrides is not valid JSON: {e}") from None
    for flag in ("max_num_seqs", "enforce_eager", "trust_remote_code"):
        if getattr(args, flag) is not None:
            kwargs[flag] = getattr(args, flag)
    if args.limit_mm_per_prompt:
        try:
            kwargs["limit_mm_per_prompt"] = json.loads(args.limit_mm_per_prompt)
        except json.JSONDecodeError as e:
            raise ValueError(f"--limit-mm-per-prompt is not valid JSON: {e}") from None
    return kwargs


def with_lora_flags(model: str | None, kwargs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The LoRA flags as stage overrides of the pipeline's LoRA stages (which stages those are needs the
    resolved pipeline: an ``AsyncOmni`` is built for it, nothing starts). The flags win over
    ``--stage-overrides`` for the keys they set."""
    from omnistage import AsyncOmni
    from omnistage.lora import cli_overrides, parse_lora_modules

    modules = parse_lora_modules(args.lora_modules or [])
    enable = bool(args.enable_lora or args.allow_runtime_lora_updating)
    if not (modules or enable or args.max_loras or args.max_lora_rank):
        return kwargs
    pipeline = AsyncOmni(model, **kwargs).pipeline
    extra = cli_overrides(
        pipeline, lora_modules=modules, enable_lora=enable, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank
    )
    overrides = dict(kwargs.get("stage_overrides") or {})
    for sid, fields in extra.items():
        key = next((k for k in overrides if str(k) == str(sid)), str(sid))
        overrides[key] = {**(overrides.get(key) or {}), **fields}
    return {**kwargs, "stage_overrides": overrides}


def serve_options(args: argparse.Namespace) -> Any:
    """The ServeOptions the flags ask for (what the server enforces per request)."""
    from omnistage.server import ServeOptions

    return ServeOptions(
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        max_pending=args.max_pending,
        allowed_local_media_path=args.allowed_local_media_path,
        max_media_bytes=int(args.max_upload_mb * (1 << 20)),
        shutdown_grace_s=args.shutdown_timeout,
        max_download_bytes=int(args.max_download_mb * (1 << 20)),
        media_fetch_timeout_s=args.media_fetch_timeout,
        max_audio_s=args.max_audio_seconds,
        allowed_media_domains=args.allowed_media_domains,
        request_timeout_s=args.request_timeout,
        max_image_pixels=args.max_image_pixels,
        max_num_frames=args.max_num_frames,
        max_inference_steps=args.max_inference_steps,
        max_tokens=args.max_tokens,
        allow_runtime_lora_updating=args.allow_runtime_lora_updating,
        max_realtime_sessions=args.max_realtime_sessions,
        realtime_max_buffer_s=args.realtime_max_audio_seconds,
        realtime_idle_timeout_s=args.realtime_idle_timeout,
        realtime_max_session_s=args.realtime_max_session_seconds,
        duplex_resume_grace_s=args.duplex_resume_grace,
        duplex_frame_budget_ms=args.duplex_frame_budget_ms,
    )


def memory_problems(engine: Any, args: argparse.Namespace) -> list[str]:
    """The memory plan's verdict (memory_plan.py) when the device size is known: weights and vLLM's reservations
    per device. The diffusion activation estimate is only logged (``omnistage plan`` checks it): it assumes the
    largest batch at the size caps, which a deploy may never see."""
    from omnistage.cli.plan import device_memory
    from omnistage.memory_plan import plan_memory

    memory = device_memory(args.device_memory)
    if memory is None:
        return []
    limits = dict(max_image_pixels=args.max_image_pixels, max_num_frames=args.max_num_frames)
    full = plan_memory(engine.pipeline, engine.deploy, engine.model, memory, **limits)
    logging.getLogger(__name__).info("memory plan:\n%s", full.format())
    return plan_memory(engine.pipeline, engine.deploy, engine.model, memory, activations=False, **limits).problems


def log_parallel_layouts(engine: Any) -> None:
    """The layout each multi-device diffusion replica will run with (ranks, degrees, devices, backend)."""
    from omnistage.stages.diffusion.parallel.layout import replica_lines

    for line in replica_lines(engine.pipeline, engine.deploy):
        logger.info(line)


def quiet_progress_bars() -> None:
    """No tqdm bars (diffusers' "Loading pipeline components", transformers' "Loading weights") in a server log
    that is not a terminal: they interleave with the log lines. tqdm and huggingface_hub read the environment on
    import, here and in engine child processes (a value the user set wins); called before anything imports
    them, and a library imported already is switched off through its own call."""
    if sys.stderr.isatty():
        return
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["TQDM_DISABLE"] == "1":
        for name in ("diffusers.utils.logging", "transformers.utils.logging"):
            if name in sys.modules:  # importing one here would cost a chat server seconds it may never spend
                sys.modules[name].disable_progress_bar()


class _DropMessages(logging.Filter):
    def __init__(self, *starts: str):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_library_warnings() -> None:
    """Library warnings a server's user cannot act on, dropped at their source logger. transformers' "Token
    indices sequence length is longer than the specified maximum ... will result in indexing errors" comes from
    diffusers measuring how long a prompt is before it truncates it: nothing is indexed out of range, and
    diffusers' own warning right after names the words it cut (that one stays)."""
    logging.getLogger("transformers.tokenization_utils_base").addFilter(
        _DropMessages("Token indices sequence length is longer than the specified maximum")
    )


def public_url(host: str, port: int) -> str:
    """Where a browser on this machine reaches the server (0.0.0.0 / :: listen everywhere: localhost)."""
    shown = "localhost" if host in ("0.0.0.0", "::", "") else (f"[{host}]" if ":" in host else host)
    return f"http://{shown}:{port}"


def ready_line(host: str, port: int, model_name: str) -> str:
    url = public_url(host, port)
    return f"ready: playground: {url}/ | API: {url}/v1 | model: {model_name}"


def _server_class() -> type:
    import asyncio
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, saying where to go once the engine is up, and exiting 0 after a graceful stop."""

        model_name = ""
        app: Any = None
        stop_bound_s = 30.0 + STOP_STAGES_S
        _deadline: threading.Timer | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            if self._deadline is None:  # the first stop signal: from now on the exit is bounded
                self._deadline = threading.Timer(self.stop_bound_s, _exit_now, args=(self.stop_bound_s,))
                self._deadline.daemon = True
                self._deadline.start()
            if not self.started and self.app is not None:  # still starting: stop that (app.py's lifespan)
                cancel = getattr(self.app.state, "cancel_start", None)
                if cancel is not None:
                    cancel()

        async def shutdown(self, sockets: Any = None) -> None:
            # uvicorn would wait for the connections, then cancel what still runs (a bare 500, a stream cut off,
            # realtime sessions closed at once): the app drains them first, so each ends with a 503 saying why
            for listening in self.servers:
                listening.close()  # no new connections from now on
            if self.app is not None:
                drain = asyncio.ensure_future(self.app.state.omni.drain.run())
                while not drain.done() and not self.force_exit:  # a second Ctrl-C: quit now, as uvicorn does
                    await asyncio.wait({drain}, timeout=0.1)
            self.config.timeout_graceful_shutdown = DRAINED_CLOSE_S
            await super().shutdown(sockets)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:  # the app's startup (the engine) is done and the socket listens: healthy
                logger.info(ready_line(self.config.host, self.config.port, self.model_name))

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            with super().capture_signals():
                yield
                # uvicorn would re-raise SIGTERM / SIGINT once shut down, so the process dies by the signal and
                # `make serve` reports "*** Terminated"; the shutdown was graceful, so it is a plain exit 0
                self._captured_signals.clear()

    return Server


def _exit_now(bound_s: float) -> None:
    """The stop took longer than its bound (a stage hung while stopping): exit at once. The kernel ends every
    child process with this one."""
    logger.error("shutdown: still running %.0f s after the stop signal; exiting now", bound_s)
    logging.shutdown()
    os._exit(1)


def end_leftover_children() -> None:
    """Once the app has stopped every stage, a child process still running is one that was being started when
    the stop came (a vLLM engine core of a stage mid-rebuild): end it now, or interpreter exit (multiprocessing
    joins its children) would wait for it. SIGTERM first: vLLM's engine core then ends the workers it has
    started (a worker still starting is not yet tied to it: see stages/lifetime.py)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        logger.warning("shutdown: ending process %s (%d), still starting", child.name, child.pid)
        child.terminate()
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join(5)


def unreachable_store(settings: Any) -> str | None:
    """Why the job store or the media store cannot be used, checked before any model loads (None when both
    answer)."""
    import asyncio

    from omnistage.server.fleet import probe_stores
    from omnistage.server.jobs import StoreUnavailable

    try:
        asyncio.run(probe_stores(settings))
    except StoreUnavailable as e:
        return str(e)
    return None


def bound_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the engine starts: a port in use fails at once, not after the models
    loaded, and nothing can take the port meanwhile. It listens only once the engine is up (uvicorn), so until
    then a client is refused rather than left waiting."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def run(args: argparse.Namespace) -> int:
    quiet_progress_bars()  # first: before the imports below bring tqdm in
    import uvicorn
    from pydantic import ValidationError

    from omnistage import AsyncOmni
    from omnistage.config.settings import server_settings
    from omnistage.server import create_app

    logging.getLogger().setLevel(args.log_level.upper())
    quiet_library_warnings()
    if args.allowed_local_media_path and not Path(args.allowed_local_media_path).is_dir():
        print(f"error: --allowed-local-media-path {args.allowed_local_media_path!r} is not a folder", file=sys.stderr)
        return 2
    try:
        engine = AsyncOmni(args.model, **with_lora_flags(args.model, engine_kwargs(args), args))  # (loads nothing yet)
        stores = {"job_store": args.job_store, "media_store": args.media_store}
        settings = server_settings(stores, engine.deploy.server)  # flags > OMNISTAGE_SERVER_* > the deploy file
        stores_problem = unreachable_store(settings)
        if stores_problem:
            print(f"error: {stores_problem}", file=sys.stderr)
            return 2
    except (ValueError, ValidationError) as e:  # bad configuration: a clear message, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    problems = memory_problems(engine, args)
    if problems:
        print("error: the deploy does not fit its devices:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    options = serve_options(args)
    log_parallel_layouts(engine)
    try:
        app = create_app(engine, settings, options)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        sock = bound_socket(args.host, args.port)
    except OSError as e:
        print(f"error: --host {args.host} --port {args.port}: {e.strerror or e}", file=sys.stderr)
        return 2
    # access_log off: the app logs every request itself (id, status, latency: server/middleware.py), and a second
    # line per request costs the event loop a write under load
    server = _server_class()(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=int(args.shutdown_timeout),
            access_log=False,
        )
    )
    server.model_name = app.state.omni.model_name
    server.app = app
    server.stop_bound_s = args.shutdown_timeout + STOP_STAGES_S
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # a second Ctrl-C: uvicorn's forced exit
        pass
    finally:
        end_leftover_children()
    return 0 if server.started else 3  # uvicorn.run's STARTUP_FAILURE
