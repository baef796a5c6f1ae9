"""``omnistage serve`` subprocesses on tiny folders, for the fixtures that share one across modules."""

from __future__ import annotations

from collections.abc import Iterator

from omnistage.testing.server import ServeProcess


def serve_tiny(tiny_model, tmp_path_factory, family: str, name: str, *args: str) -> Iterator[str]:
    """Serve the tiny ``family`` folder as model ``name`` (more ``omnistage serve`` args after): yields its URL,
    then stops it (and checks it stopped cleanly). A fixture body: ``yield from serve_tiny(...)``."""
    log = tmp_path_factory.mktemp(f"{family}-server") / "server.log"
    server = ServeProcess.launch([str(tiny_model(family)), "--served-model-name", name, *args], log)
    yield server.url
    server.stop()
