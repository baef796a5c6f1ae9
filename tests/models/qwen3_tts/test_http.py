"""Qwen3-TTS through the HTTP server (in-process uvicorn, the openai client): preset voices matched
case-insensitively, instructions, a clone from ``ref_audio`` + ``ref_text``, ``x_vector_only_mode``, a
registered voice used as ``voice``, streamed PCM equal to the whole answer, 400s naming the field. Waveforms
are compared with ``qwen-tts`` 0.1.1's goldens (conftest.py) within one 16-bit step."""

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
from tests.models.qwen3_tts.conftest import GREEDY, REF_CLIP, TINY, golden

torch.set_num_threads(1)

STEP = 1 / 32768  # one 16-bit step
KNOBS = dict(GREEDY)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from omnistage.config.settings import ServerSettings

    out = {}
    for kind in ("custom_voice", "base"):
        settings = ServerSettings(storage={"path": str(tmp_path_factory.mktemp(f"qwen3-tts-{kind}"))})
        out[kind] = serve_engine(AsyncOmni(str(TINY / kind)), settings, ready_timeout=300)
    yield {k: s.url for k, s in out.items()}
    for s in out.values():
        s.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def wav_of(content: bytes) -> np.ndarray:
    audio, rate = soundfile.read(io.BytesIO(content), dtype="int16")
    assert rate == 24000
    return audio


def within_one_step(pcm: np.ndarray, ref: np.ndarray) -> None:
    assert pcm.shape == ref.shape
    assert np.abs(pcm.astype(np.float64) * STEP - ref).max() <= STEP * 1.01


def ref_clip_url() -> str:
    buf = io.BytesIO()
    soundfile.write(buf, REF_CLIP, 24000, format="WAV", subtype="FLOAT")  # float WAV: the clip's exact samples
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def test_voices_are_the_checkpoints_speakers(servers):
    body = httpx.get(f"{servers['custom_voice']}/v1/audio/voices").json()
    assert body["voices"] == ["dylan", "ryan", "vivian"]


@pytest.mark.parametrize(
    "voice, extra, name",
    [
        ("Vivian", {}, "cv_vivian"),  # case-insensitive, as qwen-tts matches speakers
        ("RYAN", {"instructions": "Speak slowly."}, "cv_ryan_instruct"),
    ],
)
def test_preset_voice_over_http_equals_the_reference(servers, voice, extra, name):
    resp = client(servers["custom_voice"]).audio.speech.create(
        model="custom_voice",
        input="Hello world.",
        voice=voice,
        response_format="wav",
        extra_body={"language": "English", **extra, **KNOBS},
    )
    within_one_step(wav_of(resp.content), golden(name)["wav"])


def test_streamed_pcm_arrives_in_pieces_and_equals_the_whole_answer(servers):
    body = {"input": "Hello world.", "voice": "vivian", "language": "English", "response_format": "pcm", **KNOBS}
    with httpx.Client(base_url=servers["custom_voice"], timeout=120) as http:
        whole = np.frombuffer(http.post("/v1/audio/speech", json=body).content, dtype="<i2")
        reads = []
        with http.stream(
            "POST", "/v1/audio/speech", json={**body, "stream": True, "initial_codec_chunk_frames": 1}
        ) as r:
            assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
            reads = list(r.iter_raw())
    streamed = np.frombuffer(b"".join(reads), dtype="<i2")
    assert len(reads) >= 3  # the first frame, then pieces, not one body at the end
    assert np.array_equal(streamed, whole)
    within_one_step(whole, golden("cv_vivian")["wav"])


@pytest.mark.parametrize(
    "extra, name",
    [
        ({"ref_text": "This is a test."}, "vc_icl"),
        ({"x_vector_only_mode": True}, "vc_xvec"),
    ],
)
def test_clone_over_http_equals_the_reference(servers, extra, name):
    body = {
        "input": "Hello world.",
        "language": "English",
        "ref_audio": ref_clip_url(),
        "response_format": "wav",
        **extra,
        **KNOBS,
    }
    resp = httpx.post(f"{servers['base']}/v1/audio/speech", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    within_one_step(wav_of(resp.content), golden(name)["wav"])


def test_a_registered_voice_clones_like_its_clip(servers):
    url = servers["base"]
    buf = io.BytesIO()
    soundfile.write(buf, REF_CLIP, 24000, format="WAV", subtype="FLOAT")
    resp = httpx.post(
        f"{url}/v1/audio/voices",
        data={"name": "mine", "text": "This is a test."},
        files={"audio": ("clip.wav", buf.getvalue(), "audio/wav")},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    assert "mine" in httpx.get(f"{url}/v1/audio/voices").json()["voices"]
    resp = client(url).audio.speech.create(
        model="base",
        input="Hello world.",
        voice="mine",
        response_format="wav",
        extra_body={"language": "English", **KNOBS},
    )
    within_one_step(wav_of(resp.content), golden("vc_icl")["wav"])


@pytest.mark.parametrize(
    "kind, body, param",
    [
        ("custom_voice", {"voice": "bob"}, "voice"),
        ("custom_voice", {"language": "klingon"}, "language"),
        ("custom_voice", {"ref_audio": "AAAA", "ref_text": "x"}, "ref_audio"),
        ("base", {}, "ref_audio"),
        ("base", {"voice": "vivian"}, "voice"),
        ("base", {"ref_audio": "__clip__"}, "ref_text"),
    ],
)
def test_bad_requests_are_400_naming_the_field(servers, kind, body, param):
    body = {k: ref_clip_url() if v == "__clip__" else v for k, v in body.items()}
    resp = httpx.post(f"{servers[kind]}/v1/audio/speech", json={"input": "hi", **body, **KNOBS}, timeout=60)
    assert resp.status_code == 400, resp.text
    assert param in resp.json()["error"]["message"]
    if param == "voice" and kind == "custom_voice":
        assert "dylan, ryan, vivian" in resp.json()["error"]["message"]


def test_per_stage_sampling_params_list(servers):
    """The talker's params and the decoder's chunking in ``sampling_params_list`` (greedy in both models from
    ``temperature: 0`` alone), streamed."""
    body = {
        "input": "Hello world.",
        "voice": "vivian",
        "language": "English",
        "response_format": "pcm",
        "stream": True,
        "sampling_params_list": [GREEDY, {"initial_codec_chunk_frames": 2, "chunk_frames": 3}],
    }
    with httpx.Client(base_url=servers["custom_voice"], timeout=120) as http:
        with http.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            pcm = np.frombuffer(b"".join(r.iter_raw()), dtype="<i2")
    within_one_step(pcm, golden("cv_vivian")["wav"])
