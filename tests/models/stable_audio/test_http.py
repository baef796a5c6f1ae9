"""``POST /v1/audio/generate`` over real HTTP (in-process uvicorn, raw ``httpx``): the clip decoded with
soundfile equals ``StableAudioPipeline.__call__`` within one 16-bit step, in every lossless format (mp3:
its rate and channels), and a duration or format the model cannot give is a 400 naming the field. A
text-to-audio model is no speech model: ``/v1/models`` lists ``audio.generate`` (not speech, not chat) and the
realtime route refuses it by name."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
import soundfile
import websockets

from omnistage import AsyncOmni
from omnistage.models.stable_audio.tiny import MAX_SECONDS, SAMPLE_RATE
from tests.server.realtime_client import ws_url

pytestmark = pytest.mark.slow  # a server start and diffusers' pipeline: 20 s or more

STEP = 1 / 32768  # one 16-bit step: the answer is 16-bit audio, the reference float32
BODY = {"prompt": "rain on a tin roof", "duration": 0.1, "seed": 5, "num_inference_steps": 2, "guidance_scale": 7.0}


@pytest.fixture(scope="module")
def url(stable_audio_dir, server_factory):
    return server_factory(AsyncOmni(str(stable_audio_dir))).url


@pytest.fixture(scope="module")
def expected(reference):
    return reference(BODY["prompt"], seed=5, duration=0.1, num_inference_steps=2, guidance_scale=7.0)


def post(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/generate", json=body, timeout=120)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_formats_equal_diffusers(fmt, url, expected):
    r = post(url, **BODY, response_format=fmt)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == f"audio/{fmt}"
    audio, rate = soundfile.read(io.BytesIO(r.content), dtype="float32")  # [samples, channels]
    assert rate == SAMPLE_RATE and int(r.headers["X-Sample-Rate"]) == SAMPLE_RATE
    assert audio.T.shape == expected.shape == (2, int(0.1 * SAMPLE_RATE))
    assert np.abs(audio.T - np.clip(expected, -1, 1)).max() <= STEP


def test_pcm_is_interleaved_int16(url, expected):
    r = post(url, **BODY, response_format="pcm")
    assert r.status_code == 200, r.text
    pcm = np.frombuffer(r.content, dtype="<i2").reshape(-1, 2).T.astype(np.float32) * STEP
    assert pcm.shape == expected.shape
    assert np.abs(pcm - np.clip(expected, -1, 1)).max() <= STEP


def test_mp3_and_default_duration(url):
    r = post(url, prompt="church bells", seed=1, num_inference_steps=1, response_format="mp3")
    assert r.status_code == 200, r.text
    audio, rate = soundfile.read(io.BytesIO(r.content), dtype="float32")
    assert rate == SAMPLE_RATE and audio.ndim == 2 and audio.shape[1] == 2
    assert r.headers["X-Audio-Duration-S"] == f"{MAX_SECONDS:.3f}"  # no duration: the model's longest clip


@pytest.mark.parametrize(
    "body,field",
    [
        ({"duration": MAX_SECONDS + 0.01}, "duration"),  # longer than the model makes
        ({"duration": 0}, "duration"),
        ({"duration": -1}, "duration"),
        ({"duration": "long"}, "duration"),
        ({"duration": 1e-6}, "duration"),  # not one sample long
        ({"response_format": "ogg"}, "response_format"),
        ({"prompt": ""}, "prompt"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"n": 2}, "n"),  # one clip per answer
    ],
)
def test_bad_field_is_400_naming_it(body, field, url):
    r = post(url, **{**BODY, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field, err
    assert field in err["message"]


def test_models_lists_the_generate_route_only(url):
    card = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    assert card["output_modalities"] == ["audio"]
    assert card["routes"] == ["audio.generate"]  # no speech (no voices, no conversation), no chat
    assert "voices" not in card


async def test_realtime_refuses_it_naming_the_model(url):
    async with websockets.connect(ws_url(url)) as ws:
        ev = json.loads(await ws.recv())
        assert ev["type"] == "error" and ev["error"]["code"] == "unsupported_model", ev
        assert ev["error"]["param"] == "model" and "cannot hold a conversation" in ev["error"]["message"]
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
        assert ws.close_code == 1003  # unsupported data: nothing was set up
