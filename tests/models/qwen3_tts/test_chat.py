"""Qwen3-TTS through chat turns: ``/v1/chat/completions`` with ``modalities: ["audio"]`` (the openai client) and
offline ``Omni`` with ``messages`` speak the last user message's text. Compared with ``qwen-tts`` 0.1.1's goldens
(conftest.py; the dialect case runs with ``language: Auto``, what a chat turn gets) within one 16-bit step, and
with ``/v1/audio/speech`` for the same text and voice (sample for sample)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile
import torch

from omnistage import AsyncOmni, Omni
from omnistage.testing.server import serve_engine
from tests.models.qwen3_tts.conftest import GREEDY, TINY, golden

torch.set_num_threads(1)

STEP = 1 / 32768  # one 16-bit step
TOL = 1e-4  # test_pipeline.py's bar against the reference


@pytest.fixture(scope="module")
def url():
    server = serve_engine(AsyncOmni(str(TINY / "custom_voice")), ready_timeout=300)
    yield server.url
    server.stop()


def chat_wav(url: str, messages: list, voice: str) -> np.ndarray:
    resp = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0).chat.completions.create(
        model="custom_voice",
        messages=messages,
        modalities=["audio"],
        audio={"voice": voice, "format": "wav"},
        extra_body=GREEDY,
    )
    message = resp.choices[0].message
    audio, rate = soundfile.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="int16")
    assert rate == 24000
    return audio


def speech(url: str, text: str, voice: str, fmt: str = "wav") -> np.ndarray:
    resp = httpx.post(
        f"{url}/v1/audio/speech", json={"input": text, "voice": voice, "response_format": fmt, **GREEDY}, timeout=120
    )
    assert resp.status_code == 200, resp.text
    if fmt == "pcm":
        return np.frombuffer(resp.content, dtype="<i2")
    audio, _ = soundfile.read(io.BytesIO(resp.content), dtype="int16")
    return audio


def test_chat_speaks_the_last_user_message_like_the_speech_route(url):
    messages = [
        {"role": "user", "content": "Not this one."},
        {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": [{"type": "text", "text": "你好，世界。"}]},
    ]
    audio = chat_wav(url, messages, "DYLAN")  # audio.voice matched case-insensitively, as on the speech route
    ref = golden("cv_dylan_dialect")["wav"]
    assert audio.shape == ref.shape
    assert np.abs(audio.astype(np.float64) * STEP - ref).max() <= STEP * 1.01
    assert np.array_equal(audio, speech(url, "你好，世界。", "dylan"))


def test_chat_streams_the_same_audio(url):
    body = {
        "model": "custom_voice",
        "messages": [{"role": "user", "content": "Hello world."}],
        "modalities": ["audio"],
        "audio": {"voice": "vivian", "format": "pcm16"},
        "stream": True,
        **GREEDY,
    }
    pieces = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"]
                if delta and "audio" in delta[0]["delta"]:
                    pieces.append(np.frombuffer(base64.b64decode(delta[0]["delta"]["audio"]["data"]), dtype="<i2"))
    assert len(pieces) >= 2  # streamed in pieces, not one at the end
    assert np.array_equal(np.concatenate(pieces), speech(url, "Hello world.", "vivian", "pcm"))


@pytest.mark.parametrize(
    "messages, param",
    [
        ([{"role": "assistant", "content": "no user turn"}], "messages"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
            "messages",
        ),
    ],
)
def test_chat_without_text_to_speak_is_a_400(url, messages, param):
    resp = httpx.post(
        f"{url}/v1/chat/completions", json={"messages": messages, "modalities": ["audio"], **GREEDY}, timeout=60
    )
    assert resp.status_code in (400, 415), resp.text
    assert param in resp.json()["error"]["message"]


def test_offline_messages_equal_the_reference():
    prompt = {
        "messages": [{"role": "user", "content": "Hello world."}],
        "speech": {"voice": "Vivian", "language": "English"},
    }
    with Omni(str(TINY / "custom_voice")) as omni:
        (out,) = omni.generate([prompt], [GREEDY, None], use_tqdm=False)
    assert out.error is None
    assert np.abs(np.asarray(out.audio) - golden("cv_vivian")["wav"]).max() <= TOL


def test_chat_takes_the_speech_routes_fields_in_extra_body(url):
    """``language`` and ``instructions`` in extra_body reach the talker as on /v1/audio/speech: the reference's
    instruct case, and the speech route's samples for the same fields."""
    fields = {"language": "English", "instructions": "Speak slowly."}
    resp = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0).chat.completions.create(
        model="custom_voice",
        messages=[{"role": "user", "content": "Hello world."}],
        modalities=["audio"],
        audio={"voice": "Ryan", "format": "wav"},
        extra_body={**GREEDY, **fields},
    )
    audio, _ = soundfile.read(io.BytesIO(base64.b64decode(resp.choices[0].message.audio.data)), dtype="int16")
    ref = golden("cv_ryan_instruct")["wav"]
    assert audio.shape == ref.shape
    assert np.abs(audio.astype(np.float64) * STEP - ref).max() <= STEP * 1.01
    spoken = httpx.post(
        f"{url}/v1/audio/speech", json={"input": "Hello world.", "voice": "ryan", **fields, **GREEDY}, timeout=120
    )
    assert np.array_equal(audio, soundfile.read(io.BytesIO(spoken.content), dtype="int16")[0])


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"ref_audio": "data:audio/wav;base64,AAAA", "ref_text": "hi"}, "ref_audio"),  # CustomVoice cannot clone
        ({"language": "Klingon"}, "language"),
        ({"x_vector_only_mode": "maybe"}, "x_vector_only_mode"),
    ],
)
def test_chat_speech_fields_are_checked_as_on_the_speech_route(url, extra, param):
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hello."}], "modalities": ["audio"], **GREEDY, **extra},
        timeout=60,
    )
    assert resp.status_code == 400, resp.text
    assert param in resp.json()["error"]["message"]
