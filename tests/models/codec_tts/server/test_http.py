"""codec_tts through the real HTTP server (``omnistage serve`` subprocess):
``/v1/audio/speech`` as WAV and as streamed PCM, ``/v1/audio/voices``, errors (the package's server, conftest.py)."""

from __future__ import annotations

import io

import httpx
import numpy as np
import openai
import pytest
import soundfile

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

FRAMES = 40  # K=2 tokens per frame, 320 samples per frame at 16 kHz
KNOBS = {"temperature": 0, "max_tokens": 2 * FRAMES, "min_tokens": 2 * FRAMES}


def test_voices_are_listed(tts_server):
    body = httpx.get(f"{tts_server}/v1/audio/voices").json()
    assert body["voices"] == ["alto", "bass"]
    assert [v["id"] for v in body["data"]] == ["alto", "bass"]


def test_speech_wav_has_the_expected_length(tts_server):
    client = openai.OpenAI(base_url=f"{tts_server}/v1", api_key="none", max_retries=0)
    resp = client.audio.speech.create(
        model="tiny-tts", input="hello world", voice="bass", response_format="wav", extra_body=KNOBS
    )
    audio, rate = soundfile.read(io.BytesIO(resp.content), dtype="float32")
    assert rate == 16000 and audio.shape == (FRAMES * 320,)
    assert np.abs(audio).max() > 0.01  # not silence


def test_streamed_pcm_arrives_in_pieces_and_equals_the_whole_response(tts_server):
    body = {"model": "tiny-tts", "input": "good morning", "voice": "alto", "response_format": "pcm", **KNOBS}
    with httpx.Client(base_url=tts_server, timeout=120) as client:
        whole = client.post("/v1/audio/speech", json=body)
        assert whole.status_code == 200
        audio = np.frombuffer(whole.content, dtype="<i2")
        reads = []
        with client.stream("POST", "/v1/audio/speech", json={**body, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["x-sample-rate"] == "16000"
            for piece in r.iter_raw():
                reads.append(piece)
    pcm = np.frombuffer(b"".join(reads), dtype="<i2")
    assert len(reads) >= 3  # several chunks, not one body at the end (10 chunks of 4 frames were sent)
    assert pcm.shape == (FRAMES * 320,)
    # Same tokens (greedy) and the same decode up to float rounding: 16-bit samples differ by at most 1.
    assert np.abs(pcm.astype(np.int32) - audio.astype(np.int32)).max() <= 1


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "hi", "voice": "tenor"}, "voice"),
        ({"input": "   "}, "prompt"),
        ({"input": "hi", "speed": 1.5}, "speed"),
        ({"input": "hi", "instructions": "whisper"}, "instructions"),
    ],
)
def test_bad_requests_are_400_naming_the_field(tts_server, body, param):
    resp = httpx.post(f"{tts_server}/v1/audio/speech", json={**body, **KNOBS}, timeout=60)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert param in err["message"]
