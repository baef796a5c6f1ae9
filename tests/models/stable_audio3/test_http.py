"""``POST /v1/audio/generate`` with a Stable Audio 3 model over real HTTP (in-process uvicorn; the official
``openai`` client's generic ``post``, which has no typed method for this route, and raw ``httpx``): the stereo
clip decoded with soundfile equals ``StableAudio3Pipeline.__call__`` within one 16-bit step (wav, flac, pcm),
requests of different durations sent at once each get their own clip, and a value the model cannot take is a
400 naming the field."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import soundfile

from omnistage import AsyncOmni
from omnistage.models.stable_audio3.tiny import SAMPLE_RATE

pytestmark = pytest.mark.slow  # a server start and diffusers' pipeline: 20 s or more

STEP = 1 / 32768  # one 16-bit step: the answer is 16-bit audio, the reference float32
BATCH = 1e-6  # requests sharing forwards against each alone (float noise, measured <= 9e-8: test_engine.py)
BODY = {"prompt": "rain on a tin roof", "duration": 0.3, "seed": 5, "num_inference_steps": 3}


@pytest.fixture(scope="module")
def url(stable_audio3_dir, server_factory):
    return server_factory(AsyncOmni(str(stable_audio3_dir))).url


def post(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/generate", json=body, timeout=120)


def stereo(content: bytes) -> np.ndarray:
    audio, rate = soundfile.read(io.BytesIO(content), dtype="float32")  # [samples, channels]
    assert rate == SAMPLE_RATE and audio.shape[1] == 2
    return audio.T


def test_openai_client_wav_equals_diffusers(url, reference):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    r = client.post("/audio/generate", body={**BODY, "response_format": "wav"}, cast_to=httpx.Response)
    assert r.headers["content-type"] == "audio/wav" and int(r.headers["X-Sample-Rate"]) == SAMPLE_RATE
    expected = reference(BODY["prompt"], seed=5, duration=0.3, num_inference_steps=3)
    audio = stereo(r.content)
    assert audio.shape == expected.shape == (2, int(0.3 * SAMPLE_RATE))
    assert np.abs(audio - expected).max() <= STEP


def test_flac_and_pcm_equal_diffusers(url, reference):
    expected = reference(BODY["prompt"], seed=5, duration=0.3, num_inference_steps=3)
    flac = post(url, **BODY, response_format="flac")
    assert flac.status_code == 200, flac.text
    assert np.abs(stereo(flac.content) - expected).max() <= STEP
    pcm = post(url, **BODY, response_format="pcm")
    assert pcm.status_code == 200, pcm.text
    samples = np.frombuffer(pcm.content, dtype="<i2").reshape(-1, 2).T.astype(np.float32) * STEP  # interleaved
    assert samples.shape == expected.shape
    assert np.abs(samples - expected).max() <= STEP


def test_concurrent_durations_each_equal_diffusers(url, reference):
    bodies = [dict(BODY, prompt=p, seed=s, duration=d) for p, s, d in
              [("a dog barking", 1, 0.2), ("waves on a beach at night", 2, 0.2), ("thunder", 3, 0.45)]]  # fmt: skip
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: post(url, **b, response_format="wav"), bodies))
    for body, r in zip(bodies, answers):
        assert r.status_code == 200, r.text
        expected = reference(body["prompt"], seed=body["seed"], duration=body["duration"], num_inference_steps=3)
        audio = stereo(r.content)
        assert audio.shape == expected.shape == (2, int(body["duration"] * SAMPLE_RATE))
        assert np.abs(audio - expected).max() <= STEP + BATCH


@pytest.mark.parametrize(
    "body,field",
    [
        ({"duration": 12.5}, "duration"),  # above the duration embedder's max_val (the tiny's 12 s)
        ({"duration": 0}, "duration"),
        ({"duration": -1}, "duration"),
        ({"duration": "long"}, "duration"),
        ({"extra_body": {"duration": 40}}, "duration"),
        ({"response_format": "ogg"}, "response_format"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
    ],
)
def test_bad_field_is_400_naming_it(body, field, url):
    r = post(url, **{**BODY, "duration": None, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field, err
    assert field in err["message"]


def test_openai_client_gets_the_400(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError) as e:
        client.post("/audio/generate", body={**BODY, "duration": 100}, cast_to=httpx.Response)
    assert e.value.body["param"] == "duration"


def test_models_lists_the_generate_route_only(url):
    card = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    assert card["output_modalities"] == ["audio"]
    assert card["routes"] == ["audio.generate"]
