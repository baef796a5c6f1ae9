"""``omnistage serve [MODEL]``: the OpenAI-compatible HTTP server (uvicorn + FastAPI).

With no MODEL the built-in demo pipeline is served. Engine flags become
stage deploy fields (CLI > --stage-overrides > deploy YAML > pipeline defaults).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from omnistage.cli.args import positive_int

logger = logging.getLogger("omnistage.serve")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a pipeline behind an OpenAI-compatible HTTP API",
                       description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", help="local model folder (default: the built-in demo)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", help="name clients send as 'model' (default: the model path)")
    p.add_argument("--api-key", default=os.environ.get("OMNISTAGE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (or set OMNISTAGE_API_KEY)")
    cfg = p.add_mutually_exclusive_group()
    cfg.add_argument("--deploy-config", metavar="FILE", help="deploy YAML")
    cfg.add_argument("--stage-configs-path", metavar="FILE", help="deploy YAML (legacy name)")
    p.add_argument("--stage-overrides", metavar="JSON", help='per-stage fields, e.g. \'{"0": {"max_num_seqs": 4}}\'')
    p.add_argument("--pipeline", help="force a registered pipeline (see `omnistage pipelines`)")
    p.add_argument("--max-num-seqs", type=positive_int, help="max requests batched per stage")
    p.add_argument("--enforce-eager", action="store_true", default=None, help="no CUDA graphs / compilation")
    p.add_argument("--trust-remote-code", action="store_true", default=None)
    p.add_argument("--distributed-executor-backend", choices=["mp", "ray"])
    p.add_argument("--allowed-local-media-path", metavar="DIR", help="allow file:// media URLs under DIR")
    p.add_argument("--max-pending", type=positive_int,
                   help="requests in flight at once; more are answered 503 with Retry-After")
    p.add_argument("--max-upload-mb", type=float, default=20.0, help="largest media input (file, URL, data: URL)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish on shutdown")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


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
    return kwargs


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from omnistage import AsyncOmni
    from omnistage.config.settings import ServerSettings
    from omnistage.server import ServeOptions, create_app

    logging.getLogger().setLevel(args.log_level.upper())
    if args.allowed_local_media_path and not Path(args.allowed_local_media_path).is_dir():
        print(f"error: --allowed-local-media-path {args.allowed_local_media_path!r} is not a folder", file=sys.stderr)
        return 2
    try:
        settings = ServerSettings()
        engine = AsyncOmni(args.model, **engine_kwargs(args))
    except (ValueError, ValidationError) as e:  # bad configuration: a clear message, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    options = ServeOptions(served_model_name=args.served_model_name, api_key=args.api_key,
                           max_pending=args.max_pending, allowed_local_media_path=args.allowed_local_media_path,
                           max_media_bytes=int(args.max_upload_mb * (1 << 20)), shutdown_grace_s=args.shutdown_timeout)
    app = create_app(engine, settings, options)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=int(args.shutdown_timeout))
    return 0
