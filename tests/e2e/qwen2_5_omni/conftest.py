"""One tiny Qwen2.5-Omni server (``omnistage serve`` subprocess, ~60 s to start and stop) for this package's
modules: tests/conftest.py keeps a package listed in ONE_WORKER on one xdist worker, so the package-scoped fixture
starts once."""

from __future__ import annotations

import pytest

from omnistage.testing.server import ServeProcess


@pytest.fixture(scope="package")
def server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("omni25log") / "server.log"
    proc = ServeProcess.launch([str(tiny_model("qwen2_5_omni")), "--served-model-name", "tiny-omni25",
                                "--stage-overrides", '{"0": {"max_model_len": 1024}}'], log)
    yield proc.url
    proc.stop()
