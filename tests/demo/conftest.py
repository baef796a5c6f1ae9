"""Shared fixtures for the demo tests: the demo's rendering code and a real HTTP server."""

from __future__ import annotations

import importlib.util
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="session")
def shapes():
    """demo/shapes.py (a script folder, not a package)."""
    spec = importlib.util.spec_from_file_location("demo_shapes", REPO / "demo" / "shapes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def demo_server():
    """``omnistage serve`` with no model, in this process: uvicorn on a free port. Yields its base URL."""
    import uvicorn

    from omnistage.config.settings import ServerSettings
    from omnistage.engine.async_omni import AsyncOmni
    from omnistage.server.app import create_app

    app = create_app(AsyncOmni(model=None), ServerSettings())
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="demo-server", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            pytest.fail("the demo server did not become healthy")
        time.sleep(0.5)
    yield url
    server.should_exit = True
    thread.join(60)
