"""XTTS v2 through the HTTP server (in-process, the ``openai`` client and httpx; audio decoded with soundfile):
a whole answer equal to coqui-tts 0.28.0's ``Xtts.inference`` and a streamed one to its ``inference_stream``
(goldens, conftest.py) within one 16-bit step, ``/v1/audio/voices``, 400s naming the field."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import soundfile
import torch

from omnistage import AsyncOmni
from omnistage.testing.server import serve_engine
from tests.models.xtts.conftest import CASES, STREAMS, golden, stream_pieces, within_one_step

pytestmark = pytest.mark.slow

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def url(xtts_dir, tmp_path_factory):
    from omnistage.config.settings import ServerSettings

    settings = ServerSettings(storage={"path": str(tmp_path_factory.mktemp("xtts-server"))})
    server = serve_engine(AsyncOmni(str(xtts_dir)), settings, ready_timeout=300)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def clip_url(clip):
    buf = io.BytesIO()
    soundfile.write(buf, clip[0], clip[1], format="WAV", subtype="FLOAT")  # float WAV: the clip's exact samples
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def test_whole_speech_in_a_registered_voice_equals_the_references_inference(url, clip):
    """The clip registered once as a voice (the stage caches its conditioning by content), spoken by name."""
    buf = io.BytesIO()
    soundfile.write(buf, clip[0], clip[1], format="WAV", subtype="FLOAT")
    resp = httpx.post(
        f"{url}/v1/audio/voices",
        data={"name": "mine", "text": "unused by xtts"},
        files={"audio": ("clip.wav", buf.getvalue())},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    assert "mine" in httpx.get(f"{url}/v1/audio/voices").json()["voices"]
    text, language, params, _ = CASES["greedy_en"]
    resp = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0).audio.speech.create(
        model="xtts", input=text, voice="mine", response_format="wav", extra_body={"language": language, **params}
    )
    audio, rate = soundfile.read(io.BytesIO(resp.content), dtype="int16")
    assert rate == 24000
    within_one_step(audio, golden("whole_greedy_en")["pcm"])


def test_streamed_pcm_equals_the_references_stream(url, clip_url):
    case, seed, chunk = STREAMS["es_seed0"]
    text, language, _, _ = CASES[case]
    body = {"input": text, "language": language, "ref_audio": clip_url, "response_format": "pcm", "stream": True}
    with httpx.Client(base_url=url, timeout=300) as http:
        # the decoder's chunk size (the release's stream_chunk_size) as stage 1's param
        per_stage = {"sampling_params_list": [{"seed": seed}, {"chunk_frames": chunk}]}
        with http.stream("POST", "/v1/audio/speech", json={**body, **per_stage}) as r:
            assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
            reads = list(r.iter_raw())
    streamed = np.frombuffer(b"".join(reads), dtype="<i2")
    assert len(reads) >= 2  # pieces as they are decoded (4 here; reads may join some), not one body at the end
    within_one_step(streamed, np.concatenate(stream_pieces("es_seed0")))


def test_voices_and_bad_fields(url, clip_url):
    assert httpx.get(f"{url}/v1/audio/voices").json()["voices"][0] == "default"
    body = {"input": "hello there", "ref_audio": clip_url, "max_tokens": 2}
    for extra, field in [({"language": "klingon"}, "language"), ({"speed": 0}, "speed"), ({"ref_audio": None}, "")]:
        resp = httpx.post(f"{url}/v1/audio/speech", json={**body, **extra}, timeout=120)
        assert resp.status_code == 400, resp.text
        assert field in resp.text
