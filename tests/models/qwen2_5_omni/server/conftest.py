"""One tiny Qwen2.5-Omni server (``omnistage serve`` subprocess, ~60 s to start and stop) for this package's
modules: tests/conftest.py keeps a package listed in ONE_WORKER on one xdist worker, so the package-scoped fixture
starts once."""

from __future__ import annotations

import pytest

from tests.e2e.servers import serve_tiny


@pytest.fixture(scope="package")
def server(tiny_model, tmp_path_factory):
    yield from serve_tiny(
        tiny_model,
        tmp_path_factory,
        "qwen2_5_omni",
        "tiny-omni25",
        "--stage-overrides",
        '{"0": {"max_model_len": 1024}}',
    )
