"""CSM through the real HTTP server (``omnistage serve`` subprocess on the tiny folder): ``/v1/audio/speech``
with speaker ids, a reference clip as context and a registered voice, whole and streamed, against
transformers' ``CsmForConditionalGeneration.generate``; bad input is a 400 naming the field."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import soundfile

from omnistage.testing.server import ServeProcess
from tests.models.csm.conftest import TransformersReference, clip

pytestmark = pytest.mark.slow

FRAMES = 10
KNOBS = {"temperature": 0, "max_tokens": FRAMES}
PCM_TOL = 1e-4 + 1 / 32767  # float decode within 1e-4, then 16-bit rounding


@pytest.fixture(scope="module")
def csm_folder(tiny_model):
    return tiny_model("csm")


@pytest.fixture(scope="module")
def server(csm_folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("csmlog") / "server.log"
    with pytest.MonkeyPatch.context() as mp:  # its own storage: registered voices stay out of other servers
        mp.setenv("OMNISTAGE_SERVER_STORAGE__PATH", str(tmp_path_factory.mktemp("csm-storage")))
        srv = ServeProcess.launch([str(csm_folder), "--served-model-name", "tiny-csm"], log)
    yield srv.url
    srv.stop()


@pytest.fixture(scope="module")
def ref(csm_folder):
    return TransformersReference(csm_folder)


def wav_bytes(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, audio, 24000, format="WAV", subtype="FLOAT")  # float: the server reads the same samples
    return buf.getvalue()


def pcm(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    return np.frombuffer(resp.content, dtype="<i2").astype(np.float32) / 32768


def speak(url: str, **body) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/audio/speech", json={"model": "tiny-csm", "response_format": "pcm", **KNOBS, **body}, timeout=120
    )


def test_voices_are_the_speaker_ids(server):
    assert httpx.get(f"{server}/v1/audio/voices").json()["voices"] == ["0", "1"]


def test_speaker_ids_equal_transformers(server, ref):
    for voice in ("0", "1"):
        audio = pcm(speak(server, input="hello there", voice=voice))
        expected = ref.run([(voice, "hello there", None)], FRAMES).audio.numpy()
        assert audio.shape == expected.shape and np.abs(audio - expected).max() <= PCM_TOL


def test_max_new_tokens_counts_frames(server):
    assert pcm(speak(server, input="hi", max_tokens=None, max_new_tokens=3)).shape == (3 * 1920,)


def test_streamed_pcm_arrives_in_pieces_and_equals_the_whole(server):
    body = {"model": "tiny-csm", "input": "good morning", "voice": "1", "response_format": "pcm", **KNOBS}
    whole = pcm(speak(server, input="good morning", voice="1"))
    stream = {**body, "stream": True, "initial_codec_chunk_frames": 1}
    with (
        httpx.Client(base_url=server, timeout=120) as client,
        client.stream("POST", "/v1/audio/speech", json=stream) as r,
    ):
        assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
        reads = list(r.iter_raw())
    streamed = np.frombuffer(b"".join(reads), dtype="<i2").astype(np.float32) / 32768
    assert len(reads) >= 3  # 1 + 4 + 4 + 1 frames were sent as they were decoded
    assert streamed.shape == whole.shape == (FRAMES * 1920,)
    assert np.abs(streamed - whole).max() <= 1 / 32767  # Mimi is causal: at most one 16-bit step of rounding


def test_reference_clip_and_registered_voice_are_an_earlier_turn(server, ref):
    """A cloned voice speaks as the default speaker ("0"), its clip and transcript the turn before the text."""
    sample = clip(3)
    expected = ref.run([("0", "a clip of my voice", sample), ("0", "thank you", None)], FRAMES).audio.numpy()
    data_url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(sample)).decode()
    cloned = pcm(speak(server, input="thank you", ref_audio=data_url, ref_text="a clip of my voice"))
    assert cloned.shape == expected.shape and np.abs(cloned - expected).max() <= PCM_TOL
    added = httpx.post(
        f"{server}/v1/audio/voices",
        data={"name": "mine", "text": "a clip of my voice"},
        files={"audio": ("clip.wav", wav_bytes(sample), "audio/wav")},
        timeout=60,
    )
    assert added.status_code == 200, added.text
    assert "mine" in httpx.get(f"{server}/v1/audio/voices").json()["voices"]
    registered = pcm(speak(server, input="thank you", voice="mine"))
    assert np.abs(registered - expected).max() <= PCM_TOL
    assert httpx.delete(f"{server}/v1/audio/voices/mine").status_code == 200
    assert httpx.get(f"{server}/v1/audio/voices").json()["voices"] == ["0", "1"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "hi", "voice": "7"}, "voice"),
        ({"input": "   "}, "prompt"),
        (
            {"input": "hi", "ref_audio": "data:audio/wav;base64," + base64.b64encode(wav_bytes(clip(4))).decode()},
            "ref_text",
        ),
        ({"input": "hi", "ref_audio": "not audio at all"}, "ref_audio"),
        ({"input": "hi", "speed": 1.5}, "speed"),
        ({"input": "hi", "language": 5}, "language"),  # wrong-typed speech input
        ({"input": "hi", "instructions": "whisper"}, "instructions"),
        ({"input": "hi", "response_format": "ogg"}, "response_format"),
    ],
)
def test_bad_requests_are_400_naming_the_field(server, body, param):
    resp = speak(server, **body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param, resp.text
