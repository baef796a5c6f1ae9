"""Servers shared by more than one end-to-end test module, and the headless ``browser`` fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.browser import browser  # noqa: F401 (headless Chromium for every browser test here)


@pytest.fixture(scope="session")
def demo_server() -> Iterator[str]:
    """``omnistage serve`` with no model (the built-in demo), in this process: uvicorn on a free port.
    Yields its base URL."""
    from omnistage import AsyncOmni
    from omnistage.testing.server import serve_engine

    with serve_engine(AsyncOmni(model=None), ready_timeout=180) as srv:
        yield srv.url
