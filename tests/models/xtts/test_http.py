"""XTTS v2 through the HTTP server (in-process, the ``openai`` client and httpx; audio decoded with soundfile):
a whole answer equal to coqui-tts 0.28.0's ``Xtts.inference`` and a streamed one to its ``inference_stream``
(goldens, conftest.py) within one 16-bit step, a /v1/realtime text turn as that stream, what users type
(a price, Chinese, Japanese) spoken as the release speaks it, a text split into sentences
(``enable_text_splitting``) streamed as the release streams it, ``/v1/audio/voices``, 400s naming the field.

Goldens: ``scripts/reference/xtts/setup.sh`` (``run_reference.py`` and ``frontend_goldens.py``) regenerates them."""

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
from tests.models.xtts.conftest import (
    CASES,
    FRONTEND,
    FRONTEND_STREAM,
    STREAMS,
    golden,
    stream_pieces,
    within_one_step,
)

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


def test_what_users_type_is_spoken_as_the_release_speaks_it_and_what_it_refuses_is_a_400(url, clip_url):
    """A price, Chinese and Japanese script: spelt out and romanised as the release does (test_text.py compares
    the text with it), spoken as its ``Xtts.inference`` speaks them; a Czech ordinal, which the release's
    num2words cannot say, is a 400 naming ``input``."""
    body = {"ref_audio": clip_url, "response_format": "wav", "temperature": 0}
    for name in ("price_en", "zh", "ja"):
        text, language, _ = FRONTEND[name]
        resp = httpx.post(f"{url}/v1/audio/speech", json={**body, "input": text, "language": language}, timeout=120)
        assert resp.status_code == 200, resp.text
        within_one_step(soundfile.read(io.BytesIO(resp.content), dtype="int16")[0], golden(f"frontend_{name}")["pcm"])
    resp = httpx.post(f"{url}/v1/audio/speech", json={**body, "input": "Je to 1. den.", "language": "cs"}, timeout=60)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "input", resp.text


def test_a_text_split_into_sentences_is_spoken_and_streamed_as_the_release_does(url, clip_url):
    """``enable_text_splitting``: whole, each sentence decoded alone and the audio joined (``Xtts.inference``);
    streamed, each sentence's stream closed before the next starts (``inference_stream``); not a bool: a 400."""
    name, chunk, seed = FRONTEND_STREAM
    text, language, _ = FRONTEND[name]
    body = {"input": text, "language": language, "ref_audio": clip_url, "enable_text_splitting": True}
    with httpx.Client(base_url=url, timeout=300) as http:
        resp = http.post("/v1/audio/speech", json={**body, "response_format": "wav", "temperature": 0})
        assert resp.status_code == 200, resp.text
        within_one_step(soundfile.read(io.BytesIO(resp.content), dtype="int16")[0], golden(f"frontend_{name}")["pcm"])
        body |= {"response_format": "pcm", "stream": True}
        body |= {"sampling_params_list": [{"seed": seed}, {"chunk_frames": chunk}]}
        with http.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200, r.read()
            streamed = np.frombuffer(b"".join(r.iter_raw()), dtype="<i2")
        within_one_step(streamed, np.concatenate(stream_pieces(name, "frontend_stream")))
        resp = http.post("/v1/audio/speech", json={**body, "enable_text_splitting": "sometimes"})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "enable_text_splitting", resp.text


@pytest.mark.asyncio
async def test_a_realtime_text_turn_is_the_references_stream(url, xtts_dir, clip_url):
    """/v1/realtime (the openai client's realtime connection): a text turn, the clip and the stream settings in
    the session's ``extra_body``, comes back as the release's ``inference_stream`` of that text."""
    from tests.server.realtime_client import next_event, openai_client, read_reply

    case, seed, chunk = STREAMS["es_seed0"]
    text, language, _, _ = CASES[case]
    extra = {"ref_audio": clip_url, "language": language}
    extra |= {"sampling_params_list": [{"seed": seed}, {"chunk_frames": chunk}]}
    async with openai_client(url, "none").realtime.connect(model=xtts_dir.name) as conn:
        await next_event(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"], "extra_body": extra})
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        )
        await conn.response.create()
        reply = await read_reply(conn)
    assert reply.status == "completed" and not reply.errors
    within_one_step(np.frombuffer(reply.pcm, "<i2"), np.concatenate(stream_pieces("es_seed0")))
