"""Higgs Audio through the HTTP server (in-process uvicorn, the official openai client): speech equal to the
reference (goldens, conftest.py) within one 16-bit step, a clone from ``ref_audio`` + ``ref_text`` and from a
registered voice, streamed PCM equal to the whole answer, 400s naming the field."""

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
from tests.models.higgs_audio.conftest import golden

pytestmark = pytest.mark.slow

torch.set_num_threads(1)

STEP = 1 / 32768  # one 16-bit step
REF = golden("clone")
KNOBS = {"temperature": 0, "max_tokens": int(REF["steps"]), "sampling_params_list": [{"ras_win_len": 0}, None]}


@pytest.fixture(scope="module")
def url(higgs_dir, tmp_path_factory):
    from omnistage.config.settings import ServerSettings

    settings = ServerSettings(storage={"path": str(tmp_path_factory.mktemp("higgs-audio"))})
    server = serve_engine(AsyncOmni(str(higgs_dir)), settings, ready_timeout=300)
    yield server.url
    server.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def wav_of(content: bytes) -> np.ndarray:
    audio, rate = soundfile.read(io.BytesIO(content), dtype="int16")
    assert rate == 24000
    return audio


def within_one_step(pcm: np.ndarray, ref: np.ndarray) -> None:
    assert pcm.shape == ref.shape
    assert np.abs(pcm.astype(np.float64) * STEP - ref).max() <= STEP * 1.01


def clip_wav(seconds: float | None = None) -> bytes:
    buf = io.BytesIO()
    clip = REF["clip"] if seconds is None else np.zeros(int(seconds * 24000), np.float32)
    soundfile.write(buf, clip, 24000, format="WAV", subtype="FLOAT")  # float WAV: the clip's exact samples
    return buf.getvalue()


def clip_url(seconds: float | None = None) -> str:
    return "data:audio/wav;base64," + base64.b64encode(clip_wav(seconds)).decode()


def test_voices_list_the_default_and_the_card_the_speech_route(url):
    assert httpx.get(f"{url}/v1/audio/voices").json()["voices"] == ["default"]
    card = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    assert card["output_modalities"] == ["audio"] and card["routes"] == ["audio.speech"]  # no chat turn


def test_speech_over_http_equals_the_reference(url, higgs_dir):
    resp = client(url).audio.speech.create(
        model=higgs_dir.name, input=str(REF["text"]), voice="default", response_format="wav", extra_body=KNOBS
    )
    within_one_step(wav_of(resp.content), golden("plain")["wav"])


def test_clone_over_http_equals_the_reference(url):
    body = {
        "input": str(REF["text"]),
        "ref_audio": clip_url(),
        "ref_text": str(REF["ref_text"]),
        "response_format": "wav",
    }
    resp = httpx.post(f"{url}/v1/audio/speech", json={**body, **KNOBS}, timeout=120)
    assert resp.status_code == 200, resp.text
    within_one_step(wav_of(resp.content), REF["wav"])


def test_a_registered_voice_clones_like_its_clip(url, higgs_dir):
    resp = httpx.post(
        f"{url}/v1/audio/voices",
        data={"name": "mine", "text": str(REF["ref_text"])},
        files={"audio": ("clip.wav", clip_wav(), "audio/wav")},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    assert "mine" in httpx.get(f"{url}/v1/audio/voices").json()["voices"]
    resp = client(url).audio.speech.create(
        model=higgs_dir.name, input=str(REF["text"]), voice="mine", response_format="wav", extra_body=KNOBS
    )
    within_one_step(wav_of(resp.content), REF["wav"])


def test_streamed_pcm_arrives_in_pieces_and_equals_the_whole_answer(url):
    body = {"input": "hello there", "response_format": "pcm", **KNOBS, "max_tokens": 60}
    with httpx.Client(base_url=url, timeout=120) as http:
        whole = np.frombuffer(http.post("/v1/audio/speech", json=body).content, dtype="<i2")
        with http.stream(
            "POST", "/v1/audio/speech", json={**body, "stream": True, "initial_codec_chunk_frames": 2}
        ) as r:
            assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
            reads = list(r.iter_raw())
    streamed = np.frombuffer(b"".join(reads), dtype="<i2")
    assert len(reads) >= 3  # pieces while the LM runs, not one body at the end
    assert whole.size == (60 - 1 - 3) * 960 and np.array_equal(streamed, whole)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"voice": "bob"}, "voice"),
        ({"ref_audio": "__clip__"}, "ref_text"),
        ({"ref_audio": "__long__", "ref_text": "too long"}, "ref_audio"),
        ({"ref_text": "no clip"}, "ref_text"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_bad_requests_are_400_naming_the_field(url, body, param):
    clips = {"__clip__": clip_url(), "__long__": clip_url(31.0)}
    body = {k: clips.get(v, v) if isinstance(v, str) else v for k, v in body.items()}
    resp = httpx.post(f"{url}/v1/audio/speech", json={"input": "hi", "max_tokens": 8, **body}, timeout=60)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and param in err["message"], err


async def test_a_realtime_text_turn_is_spoken_as_the_reference(url, higgs_dir):
    """/v1/realtime (the openai client's realtime connection): a text turn comes back as the reference's speech
    of that text, within one 16-bit step (24 kHz PCM, the model's own rate)."""
    from tests.server.realtime_client import next_event, openai_client, read_reply

    plain = golden("plain")
    async with openai_client(url, "none").realtime.connect(model=higgs_dir.name) as conn:
        await next_event(conn, "session.created")
        await conn.session.update(
            session={
                "type": "realtime",
                "max_output_tokens": int(plain["steps"]),
                "audio": {"output": {"voice": "default"}},
                "extra_body": {"temperature": 0, "sampling_params_list": KNOBS["sampling_params_list"]},
            }
        )
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": str(plain["text"])}]}
        )
        await conn.response.create()
        reply = await read_reply(conn)
    assert reply.status == "completed" and not reply.errors
    within_one_step(np.frombuffer(reply.pcm, "<i2"), plain["wav"])
