"""One tiny codec_tts server (``omnistage serve`` subprocess) for this package's modules: tests/conftest.py keeps a
package listed in ONE_WORKER on one xdist worker, so the package-scoped fixture starts once."""

from __future__ import annotations

import pytest

from omnistage.testing.server import ServeProcess


@pytest.fixture(scope="package")
def tts_server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("ttslog") / "server.log"
    server = ServeProcess.launch([str(tiny_model("codec_tts")), "--served-model-name", "tiny-tts",
                                  "--stage-overrides", '{"0": {"max_model_len": 512, "dtype": "float32"}}'], log)
    yield server.url
    server.stop()
