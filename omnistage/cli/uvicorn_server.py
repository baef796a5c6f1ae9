"""uvicorn's server as ``omnistage serve`` runs it: the socket bound before the engine starts, one line saying
where to go once it is up, and a stop that drains the app's requests first and is bounded in time."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
from typing import Any

logger = logging.getLogger("omnistage.serve")

# After --shutdown-timeout, what stopping the stages may take before the process exits regardless (its child
# processes end with it: stages/lifetime.py): the requests still running get 5 s to abort and answer their 503
# (server/drain.py), an mp child 10 s to stop before it is terminated.
STOP_STAGES_S = 20.0
# Once the app has drained its requests, what the connections get to close (their answers are sent).
DRAINED_CLOSE_S = 2


def public_url(host: str, port: int) -> str:
    """Where a browser on this machine reaches the server (0.0.0.0 / :: listen everywhere: localhost)."""
    shown = "localhost" if host in ("0.0.0.0", "::", "") else (f"[{host}]" if ":" in host else host)
    return f"http://{shown}:{port}"


def ready_line(host: str, port: int, model_name: str) -> str:
    url = public_url(host, port)
    return f"ready: playground: {url}/ | API: {url}/v1 | model: {model_name}"


def server_class() -> type:
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


def make_server(app: Any, args: argparse.Namespace) -> Any:
    """The uvicorn server of ``app``, as the flags ask; it exits within --shutdown-timeout + STOP_STAGES_S of a
    stop signal."""
    import uvicorn

    # access_log off: the app logs every request itself (id, status, latency: server/middleware.py), and a second
    # line per request costs the event loop a write under load
    server = server_class()(
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
    return server
