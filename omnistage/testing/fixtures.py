"""pytest fixtures: tiny model folders built once per session and cached; omnistage servers per module.

Use from a conftest: ``pytest_plugins = ["omnistage.testing.fixtures"]``;
then ``tiny_model("sd3")`` returns the folder path and ``server_factory(engine, **serve_options)`` a
running ``ServerThread`` (see ``omnistage.testing.server``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from omnistage.testing.tiny import build


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = build(family, tmp_path_factory.mktemp(f"tiny-{family}"))
        return cache[family]

    return get


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """Serve an ``AsyncOmni`` over real HTTP in this process: ``server_factory(engine, **serve_options)``.
    Each server keeps its media in its own temporary folder; all of them stop when the module is done."""
    from omnistage.config.settings import ServerSettings
    from omnistage.testing.server import ServerThread, serve_engine

    servers: list[ServerThread] = []

    def make(engine: Any, **options: Any) -> ServerThread:
        settings = ServerSettings(storage={"path": str(tmp_path_factory.mktemp("storage"))})
        srv = serve_engine(engine, settings, **options)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()
