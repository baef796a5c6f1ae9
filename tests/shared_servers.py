"""Session-scoped servers that test modules in several folders share (tests/conftest.py loads this module as a
plugin): the built-in demo, and one in-process server per tiny image family."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def demo_server() -> Iterator[str]:
    """``omnistage serve`` with no model (the built-in demo), in this process: uvicorn on a free port.
    Yields its base URL."""
    from omnistage import AsyncOmni
    from omnistage.testing.server import serve_engine

    with serve_engine(AsyncOmni(model=None), ready_timeout=180) as srv:
        yield srv.url


@pytest.fixture(scope="session")
def family_server(tiny_model):
    """One in-process server per tiny image family for the whole session, shared by the family harness
    (tests/e2e/test_image_families_http.py) and the family's own HTTP module: ``family_server(name)`` returns
    (folder, openai client); the served model name is ``tiny-<name>``."""
    import openai

    from omnistage import AsyncOmni
    from omnistage.testing.server import serve_engine

    servers: dict[str, tuple] = {}

    def get(name: str):
        if name not in servers:
            folder = tiny_model(name)
            srv = serve_engine(AsyncOmni(str(folder)), served_model_name=f"tiny-{name}")
            client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
            servers[name] = (srv, folder, client)
        return servers[name][1:]

    yield get
    for srv, _, _ in servers.values():
        srv.stop()
