import os

import pytest

# One engine-core process per vLLM engine, no extra worker process: starts in half the time.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def tts_dir(tiny_model):
    return tiny_model("codec_tts")
