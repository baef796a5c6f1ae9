"""A real uvicorn server on a free port, in a thread of the test process (so
tests can look at the engine's state while requests run)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from omnistage import AsyncOmni
from omnistage.config.settings import ServerSettings
from omnistage.server import ServeOptions, create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    engine: Any
    app: Any
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def state(self):
        return self.app.state.omni

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(engine: Any, settings: ServerSettings | None = None, **options: Any) -> RunningServer:
    app = create_app(engine, settings or ServerSettings(), ServeOptions(**options))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=10)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name=f"uvicorn-{port}")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    return RunningServer(f"http://127.0.0.1:{port}", engine, app, server, thread)


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory):
    servers: list[RunningServer] = []

    def make(engine: Any, **options: Any) -> RunningServer:
        storage = tmp_path_factory.mktemp("storage")
        settings = ServerSettings(storage={"path": str(storage)})
        srv = start_server(engine, settings, **options)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


def error_of(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err


def new_engine(pipeline) -> AsyncOmni:
    return AsyncOmni(pipeline=pipeline)
