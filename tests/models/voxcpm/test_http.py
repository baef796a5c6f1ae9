"""VoxCPM2 through the HTTP server (in-process uvicorn, the official openai client): speech equal to the release
(goldens, conftest.py) within one 16-bit step, clones from ``ref_audio`` + ``ref_text`` and from ``ref_audio``
alone, streamed PCM equal to the whole answer, a /v1/realtime text turn, 400s naming the field."""

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
from tests.models.voxcpm.conftest import STEP, golden

pytestmark = pytest.mark.slow

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def url(voxcpm_dir, tmp_path_factory):
    from omnistage.config.settings import ServerSettings

    settings = ServerSettings(storage={"path": str(tmp_path_factory.mktemp("voxcpm"))})
    server = serve_engine(AsyncOmni(str(voxcpm_dir)), settings, ready_timeout=300)
    yield server.url
    server.stop()


def wav_of(content: bytes) -> np.ndarray:
    audio, rate = soundfile.read(io.BytesIO(content), dtype="int16")
    assert rate == 24000  # the tiny VAE's output rate
    return audio


def within_one_step(pcm: np.ndarray, ref: np.ndarray) -> None:
    assert pcm.shape == ref.shape
    assert np.abs(pcm.astype(np.float64) * STEP - ref).max() <= STEP * 1.01


def clip_url(samples: np.ndarray) -> str:
    buf = io.BytesIO()
    soundfile.write(buf, samples, 16000, format="WAV", subtype="FLOAT")  # float WAV: the clip's exact samples
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def test_voices_list_the_default(url):
    assert httpx.get(f"{url}/v1/audio/voices").json()["voices"] == ["default"]


def test_speech_over_http_equals_the_release(url, voxcpm_dir):
    ref = golden("plain")
    resp = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0).audio.speech.create(
        model=voxcpm_dir.name,
        input=str(ref["text"]),
        voice="default",
        response_format="wav",
        extra_body={"seed": int(ref["seed"])},
    )
    within_one_step(wav_of(resp.content), ref["whole"])


@pytest.mark.parametrize("case", ["clone", "reference"])
def test_clones_over_http_equal_the_release(url, case):
    ref = golden(case)
    body = {"input": str(ref["text"]), "ref_audio": clip_url(ref["clip"]), "seed": int(ref["seed"])}
    if case == "clone":
        body["ref_text"] = str(ref["clip_text"])
    resp = httpx.post(f"{url}/v1/audio/speech", json={**body, "response_format": "wav"}, timeout=120)
    assert resp.status_code == 200, resp.text
    within_one_step(wav_of(resp.content), ref["whole"])


def test_streamed_pcm_arrives_in_pieces_and_equals_the_whole_answer(url):
    ref = golden("reference")  # 58 steps
    body = {"input": str(ref["text"]), "ref_audio": clip_url(ref["clip"]), "seed": 2, "response_format": "pcm"}
    with httpx.Client(base_url=url, timeout=120) as http:
        whole = np.frombuffer(http.post("/v1/audio/speech", json=body).content, dtype="<i2")
        with http.stream("POST", "/v1/audio/speech", json={**body, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
            reads = list(r.iter_raw())
    streamed = np.frombuffer(b"".join(reads), dtype="<i2")
    assert len(reads) >= 3  # pieces while the LM runs, not one body at the end
    assert streamed.shape == whole.shape and np.abs(streamed.astype(int) - whole).max() <= 1
    within_one_step(whole, ref["whole"])


@pytest.mark.parametrize(
    "body, param",
    [
        ({"voice": "bob"}, "voice"),
        ({"ref_text": "no clip"}, "ref_text"),
        ({"speed": 1.5}, "speed"),
        ({"ref_audio": "__silent__"}, "ref_audio"),
        ({"ref_audio": "__long__"}, "ref_audio"),
        ({"ref_audio": "data:audio/wav;base64," + base64.b64encode(b"not a wav file").decode()}, "ref_audio"),
        ({"language": "en"}, "language"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_bad_requests_are_400_naming_the_field(url, body, param):
    clips = {"__silent__": clip_url(np.zeros(1600, np.float32)), "__long__": clip_url(np.ones(31 * 16000, np.float32))}
    body = {k: clips.get(v, v) if isinstance(v, str) else v for k, v in body.items()}
    resp = httpx.post(f"{url}/v1/audio/speech", json={"input": "hi", "max_tokens": 8, **body}, timeout=60)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and param in err["message"], err


async def test_a_realtime_text_turn_is_spoken_as_the_release(url, voxcpm_dir):
    """/v1/realtime (the openai client's realtime connection): a text turn comes back as the release's speech of
    that text, within one 16-bit step."""
    from tests.server.realtime_client import next_event, openai_client, read_reply

    ref = golden("plain")
    async with openai_client(url, "none").realtime.connect(model=voxcpm_dir.name) as conn:
        await next_event(conn, "session.created")
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {"output": {"voice": "default"}},
                "extra_body": {"seed": int(ref["seed"])},
            }
        )
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": str(ref["text"])}]}
        )
        await conn.response.create()
        reply = await read_reply(conn)
    assert reply.status == "completed" and not reply.errors
    within_one_step(np.frombuffer(reply.pcm, "<i2"), ref["whole"])
