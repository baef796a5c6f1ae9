"""One tiny codec_tts server (``omnistage serve`` subprocess) for this package's modules: tests/conftest.py keeps a
package listed in ONE_WORKER on one xdist worker, so the package-scoped fixture starts once."""

from __future__ import annotations

import pytest

from tests.e2e.servers import serve_tiny


@pytest.fixture(scope="package")
def tts_server(tiny_model, tmp_path_factory):
    yield from serve_tiny(
        tiny_model,
        tmp_path_factory,
        "codec_tts",
        "tiny-tts",
        "--stage-overrides",
        '{"0": {"max_model_len": 512, "dtype": "float32"}}',
    )
