import pytest


@pytest.fixture(scope="session")
def tts_dir(tiny_model):
    return tiny_model("codec_tts")
