"""One tiny Qwen3-Omni server (``omnistage serve`` subprocess, ~60 s to start and stop) for this package's modules:
tests/conftest.py keeps a package listed in ONE_WORKER on one xdist worker, so the package-scoped fixture starts
once."""

from __future__ import annotations

import pytest

from omnistage.testing.server import ServeProcess


@pytest.fixture(scope="package")
def omni_server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("omnilog") / "server.log"
    server = ServeProcess.launch([str(tiny_model("qwen3_omni")), "--served-model-name", "tiny-omni",
                                  "--stage-overrides", '{"0": {"max_model_len": 1024}}',
                                  "--max-image-pixels", str(96 * 96)], log)
    yield server.url
    server.stop()
