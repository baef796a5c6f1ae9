"""``omnistage serve [MODEL]``: the OpenAI-compatible HTTP server (uvicorn + FastAPI).

With no MODEL the built-in demo pipeline is served. Engine flags become
stage deploy fields (CLI > --stage-overrides > deploy YAML > pipeline defaults).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from omnistage.cli.serve_config import (
    engine_kwargs,
    log_parallel_layouts,
    memory_problems,
    serve_options,
    unreachable_store,
    with_lora_flags,
)
from omnistage.cli.serve_flags import add_flags
from omnistage.cli.uvicorn_server import bound_socket, end_leftover_children, make_server


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve a pipeline behind an OpenAI-compatible HTTP API", description=__doc__.splitlines()[0]
    )
    add_flags(p)


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


class _Refused(Exception):
    """A configuration the server cannot start with: one ``error:`` line, exit code 2."""


def _ready_to_serve(args: argparse.Namespace) -> tuple[Any, Any]:
    """The app (its engine built, nothing loaded yet) and its bound socket, once every check that needs no model
    has passed (the configuration, the stores, the memory plan, the port)."""
    from pydantic import ValidationError

    from omnistage import AsyncOmni
    from omnistage.config.settings import server_settings
    from omnistage.server import create_app

    logging.getLogger().setLevel(args.log_level.upper())
    quiet_library_warnings()
    if args.allowed_local_media_path and not Path(args.allowed_local_media_path).is_dir():
        raise _Refused(f"--allowed-local-media-path {args.allowed_local_media_path!r} is not a folder")
    try:
        engine = AsyncOmni(args.model, **with_lora_flags(args.model, engine_kwargs(args), args))  # (loads nothing yet)
        stores = {"job_store": args.job_store, "media_store": args.media_store}
        settings = server_settings(stores, engine.deploy.server)  # flags > OMNISTAGE_SERVER_* > the deploy file
        stores_problem = unreachable_store(settings)
        if stores_problem:
            raise _Refused(stores_problem)
    except (ValueError, ValidationError) as e:  # bad configuration: a clear message, no traceback
        raise _Refused(e) from None
    problems = memory_problems(engine, args)
    if problems:
        raise _Refused("the deploy does not fit its devices:\n  " + "\n  ".join(problems))
    options = serve_options(args)
    log_parallel_layouts(engine)
    try:
        app = create_app(engine, settings, options)
    except ValueError as e:
        raise _Refused(e) from None
    try:
        sock = bound_socket(args.host, args.port)
    except OSError as e:
        raise _Refused(f"--host {args.host} --port {args.port}: {e.strerror or e}") from None
    return app, sock


def run(args: argparse.Namespace) -> int:
    quiet_progress_bars()  # first: before the imports below bring tqdm in
    try:
        app, sock = _ready_to_serve(args)
    except _Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    server = make_server(app, args)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # a second Ctrl-C: uvicorn's forced exit
        pass
    finally:
        end_leftover_children()
    return 0 if server.started else 3  # uvicorn.run's STARTUP_FAILURE
