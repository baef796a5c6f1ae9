"""Real HTTP servers for tests and benchmarks: free ports, an ASGI app (an omnistage server or any other)
on uvicorn in a thread of the calling process, and ``omnistage serve`` as a subprocess.

In a thread, the test can look at the engine's state while requests run and the server shares the
process's tiny models; a subprocess is what a user runs (signals, logging, start-up of a fresh process).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx

HOST = "127.0.0.1"


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it; another process could still take it first)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class ServerThread:
    """A uvicorn server running ``app`` in a daemon thread; ``engine`` is the ``AsyncOmni`` it serves, if any."""

    url: str
    app: Any
    server: Any  # uvicorn.Server
    thread: threading.Thread
    engine: Any = None

    @property
    def state(self) -> Any:
        """The omnistage app's ``ServerState`` (admission, storage, metrics)."""
        return self.app.state.omni

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, **{"timeout": 60, **kw})

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        """Run ``coro`` on the server's event loop (where its engine lives) and return its result: a test's
        offline answers from the very ``AsyncOmni`` it serves, instead of a second engine started for them."""
        return asyncio.run_coroutine_threadsafe(coro, self.server.servers[0].get_loop()).result(timeout)

    def stop(self, timeout: float = 30) -> None:
        """Graceful: uvicorn stops accepting, lets open requests finish, then runs the app's shutdown."""
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_app(app: Any, *, engine: Any = None, ready_timeout: float = 60, server_class: Any = None) -> ServerThread:
    """Start ``app`` on a free local port; returns once uvicorn has run the app's startup (for an omnistage
    app: the engine has started) and listens. Raises ``RuntimeError`` if it dies or is not up in time.
    ``server_class``: a ``uvicorn.Server`` subclass taking ``.app`` (``omnistage serve``'s, with its shutdown)."""
    import uvicorn

    # the socket is bound here, before the app's startup (an engine: seconds), and handed to uvicorn: a port only
    # picked here could be taken meanwhile (tests run in parallel workers that start servers and engines too)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, host=HOST, port=port, log_level="warning", timeout_graceful_shutdown=10)
    server = (server_class or uvicorn.Server)(config)
    if server_class is not None:
        server.app = app
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"uvicorn-{port}")
    thread.start()
    deadline = time.monotonic() + ready_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the test server on port {port} did not start")
        time.sleep(0.02)
    return ServerThread(f"http://{HOST}:{port}", app, server, thread, engine)


def serve_engine(engine: Any, settings: Any = None, *, ready_timeout: float = 60, **options: Any) -> ServerThread:
    """``omnistage serve`` for an ``AsyncOmni`` in this process: ``settings`` a ``ServerSettings``,
    ``options`` the ``ServeOptions`` fields (api_key, max_pending, ...)."""
    from omnistage.server import ServeOptions, create_app

    app = create_app(engine, settings, ServeOptions(**options))
    return serve_app(app, engine=engine, ready_timeout=ready_timeout)


class PortTaken(RuntimeError):
    """The server's port was taken by another process before the server bound it."""


@dataclass
class ServeProcess:
    """``omnistage serve`` in a child process, as a user starts it."""

    proc: subprocess.Popen
    url: str
    log: Path

    @classmethod
    def launch(
        cls,
        args: list[str],
        log: Path,
        ready_timeout: float = 240,
        attempts: int = 3,
        env: dict[str, str] | None = None,
    ) -> Self:
        """``omnistage serve *args`` on a free port, output to ``log``; returns once ``/health`` answers 200. The
        child binds its port only once its engine is up, so another process may take it first: then it starts
        again on another port. ``env``: variables set over the test defaults."""
        for attempt in range(attempts):
            try:
                return cls._launch(args, log, ready_timeout, env or {})
            except PortTaken:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _launch(cls, args: list[str], log: Path, ready_timeout: float, extra_env: dict[str, str]) -> Self:
        port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        env.update(extra_env)
        proc = subprocess.Popen(
            [sys.executable, "-m", "omnistage.cli.main", "serve", *args, "--host", HOST, "--port", str(port)],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        url = f"http://{HOST}:{port}"
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                text = log.read_text()
                if "address already in use" in text.lower():  # the CLI prints the OS's "Address already in use"
                    raise PortTaken(text[-3000:])
                raise RuntimeError(f"server exited with {proc.returncode}:\n{text[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return cls(proc, url, log)
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"server did not become healthy:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)

    def stop(self, timeout: float = 90) -> None:
        """SIGTERM must shut the server down gracefully (uvicorn re-raises the signal afterwards, so -15 is a
        clean exit); raises ``AssertionError`` when it does not."""
        self.terminate()
        self.wait_stopped(timeout)

    def terminate(self) -> None:
        """``stop``'s first half: the SIGTERM, without waiting (a caller with other work meanwhile, e.g. the
        next server to start, checks the exit later with ``wait_stopped``)."""
        self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = 90) -> None:
        """``stop``'s second half: the server exits within ``timeout`` after ``terminate``, cleanly."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"server did not shut down within {timeout:.0f} s") from None
        assert code in (0, -signal.SIGTERM), code
        assert "omnistage.server: shutdown complete" in self.log.read_text()
