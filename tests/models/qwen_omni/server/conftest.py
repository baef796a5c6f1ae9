"""One tiny Qwen3-Omni server (``omnistage serve`` subprocess, ~60 s to start and stop) for this package's modules:
tests/conftest.py keeps a package listed in ONE_WORKER on one xdist worker, so the package-scoped fixture starts
once."""

from __future__ import annotations

import pytest

from tests.e2e.servers import serve_tiny


@pytest.fixture(scope="package")
def omni_server(tiny_model, tmp_path_factory):
    yield from serve_tiny(
        tiny_model,
        tmp_path_factory,
        "qwen3_omni",
        "tiny-omni",
        "--stage-overrides",
        '{"0": {"max_model_len": 1024}}',
        "--max-image-pixels",
        str(96 * 96),
    )
