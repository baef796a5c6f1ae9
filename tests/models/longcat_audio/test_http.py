"""``POST /v1/audio/generate`` with a LongCat-AudioDiT model over real HTTP (in-process uvicorn, raw ``httpx``):
the clip decoded with soundfile equals ``LongCatAudioDiTPipeline.__call__`` within one 16-bit step (wav, flac,
pcm; mp3: its rate and channels), concurrent requests of different durations each get their own clip, and a
duration the model cannot make is a 400 naming ``duration``."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile

from omnistage import AsyncOmni
from omnistage.models.longcat_audio.tiny import HOP, SAMPLE_RATE

pytestmark = pytest.mark.slow  # a server start and diffusers' pipeline: 20 s or more

STEP = 1 / 32768  # one 16-bit step: the answer is 16-bit audio, the reference float32
ENGINE = 5e-6  # the engine against diffusers (float noise, measured <= 9.1e-7: test_engine.py)
BODY = {"prompt": "rain on a tin roof", "duration": 0.3, "seed": 5, "num_inference_steps": 2, "guidance_scale": 4.0}


@pytest.fixture(scope="module")
def url(longcat_audio_dir, server_factory):
    return server_factory(AsyncOmni(str(longcat_audio_dir))).url


@pytest.fixture(scope="module")
def expected(reference):
    return reference(BODY["prompt"], seed=5, duration=0.3, num_inference_steps=2, guidance_scale=4.0)


def post(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/generate", json=body, timeout=120)


def decoded(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    audio, rate = soundfile.read(io.BytesIO(r.content), dtype="float32")
    assert rate == SAMPLE_RATE and int(r.headers["X-Sample-Rate"]) == SAMPLE_RATE and audio.ndim == 1  # mono
    return audio


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_formats_equal_diffusers(fmt, url, expected):
    r = post(url, **BODY, response_format=fmt)
    assert r.headers["content-type"] == f"audio/{fmt}"
    audio = decoded(r)
    assert audio.shape == expected.shape == (int(0.3 * SAMPLE_RATE // HOP) * HOP,)
    assert np.abs(audio - np.clip(expected, -1, 1)).max() <= STEP + ENGINE


def test_pcm_is_int16(url, expected):
    r = post(url, **BODY, response_format="pcm")
    assert r.status_code == 200, r.text
    pcm = np.frombuffer(r.content, dtype="<i2").astype(np.float32) * STEP
    assert pcm.shape == expected.shape
    assert np.abs(pcm - np.clip(expected, -1, 1)).max() <= STEP + ENGINE


def test_mp3_and_duration_from_prompt(url, reference):
    r = post(url, prompt="church bells", seed=1, num_inference_steps=1, response_format="mp3")
    assert r.status_code == 200, r.text
    audio, rate = soundfile.read(io.BytesIO(r.content), dtype="float32")
    assert rate == SAMPLE_RATE and audio.ndim == 1
    # no duration: the pipeline's estimate from the prompt, as diffusers makes it
    samples = reference("church bells", seed=1, num_inference_steps=1).shape[0]
    assert r.headers["X-Audio-Duration-S"] == f"{samples / SAMPLE_RATE:.3f}"


def test_concurrent_durations_each_equal_diffusers(url, reference):
    bodies = [dict(BODY, prompt=p, seed=s, duration=d) for p, s, d in
              [("a dog barking", 1, 0.1), ("waves on a beach at night", 2, 0.2), ("a cat", 3, 0.25),
               ("thunder", 4, 0.5)]]  # fmt: skip
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: post(url, **b, response_format="wav"), bodies))
    for body, r in zip(bodies, answers):
        expected = reference(body["prompt"], seed=body["seed"], duration=body["duration"], num_inference_steps=2,
                             guidance_scale=4.0)  # fmt: skip
        audio = decoded(r)
        assert audio.shape == expected.shape
        assert np.abs(audio - np.clip(expected, -1, 1)).max() <= STEP + ENGINE


@pytest.mark.parametrize(
    "body,field",
    [
        ({"duration": 31}, "duration"),  # longer than the pipeline's 30 s
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


def test_models_lists_the_generate_route_only(url):
    card = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    assert card["output_modalities"] == ["audio"]
    assert card["routes"] == ["audio.generate"]
