"""A reference clip as users have it (44.1 kHz stereo WAV, 48 kHz 24-bit WAV, 8 kHz WAV, 22.05 kHz MP3,
OGG/Opus, M4A/AAC, WebM/Opus) clones a voice exactly as the same clip already in the model's form: channels
averaged, resampled once with soxr HQ to Mimi's 24 kHz, a float WAV (converted in the test by
tests/e2e/media_matrix.py with the libraries themselves). Over HTTP, greedy, on the tiny CSM: ``ref_audio`` on
``/v1/audio/speech`` and a voice uploaded to ``/v1/audio/voices``. A broken file is still a 400 naming the field."""

from __future__ import annotations

import base64

import httpx
import pytest

from omnistage.testing.requires import requires_encoder
from tests.e2e import media_matrix as mm

pytestmark = [pytest.mark.slow, requires_encoder("libmp3lame", "libopus", "aac")]  # to make the clips

MODEL_RATE = 24000  # Mimi's rate: CSM's reference clips are encoded at it
MIME = {
    "wav_44k1_stereo": "audio/wav",
    "wav_48k_24bit": "audio/wav",
    "wav_8k": "audio/wav",
    "mp3_22k05": "audio/mpeg",
    "ogg_opus": "audio/ogg",
    "m4a_aac": "audio/mp4",
    "webm_opus": "audio/webm",
}
BODY = {"model": "tiny-csm", "input": "thank you", "response_format": "pcm", "temperature": 0, "max_tokens": 6}


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    from omnistage import AsyncOmni
    from omnistage.testing.server import serve_engine

    with pytest.MonkeyPatch.context() as mp:  # its own storage: the uploaded voices stay out of other servers
        mp.setenv("OMNISTAGE_SERVER_STORAGE__PATH", str(tmp_path_factory.mktemp("csm-voices")))
        with serve_engine(AsyncOmni(str(tiny_model("csm"))), served_model_name="tiny-csm") as srv:
            yield srv.url


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def speak(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json={**BODY, **body}, timeout=120)


def pcm(resp: httpx.Response) -> bytes:
    assert resp.status_code == 200, resp.text
    assert resp.content
    return resp.content


@pytest.mark.parametrize("name", list(MIME))
def test_a_reference_clip_in_any_form_clones_as_the_clip_in_the_model_form(server, name):
    data = mm.AUDIO[name]()
    want = pcm(speak(server, ref_audio=data_url(mm.model_form_audio(data, MODEL_RATE), "audio/wav"), ref_text="hi"))
    assert pcm(speak(server, ref_audio=data_url(data, MIME[name]), ref_text="hi")) == want
    voice = f"clip-{name.replace('_', '-')}"
    added = httpx.post(
        f"{server}/v1/audio/voices",
        data={"name": voice, "text": "hi"},
        files={"audio": (f"clip.{name.rsplit('_', 1)[0]}", data, MIME[name])},
        timeout=60,
    )
    assert added.status_code == 200, added.text
    try:
        assert pcm(speak(server, voice=voice)) == want
    finally:
        assert httpx.delete(f"{server}/v1/audio/voices/{voice}", timeout=60).status_code == 200


def test_other_clips_clone_other_voices(server):
    """The clip's content reaches the model: different clips, different speech."""
    outs = {pcm(speak(server, ref_audio=data_url(mm.AUDIO[n](), MIME[n]), ref_text="hi")) for n in MIME}
    assert len(outs) == len(MIME)


def test_a_broken_clip_is_still_a_400_naming_the_field(server):
    wav = mm.AUDIO["wav_44k1_stereo"]()
    for data, code in ((wav[: len(wav) // 2], "truncated_media"), (b"not audio at all" * 8, None)):
        r = speak(server, ref_audio=data_url(data, "audio/wav"), ref_text="hi")
        assert r.status_code == 400 and r.json()["error"]["param"] == "ref_audio", r.text
        assert r.json()["error"]["code"] == code, r.text
        r = httpx.post(
            f"{server}/v1/audio/voices",
            data={"name": "broken", "text": "hi"},
            files={"audio": ("clip.wav", data, "audio/wav")},
            timeout=60,
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "audio", r.text
    mp3 = mm.AUDIO["mp3_22k05"]()
    r = speak(server, ref_audio=data_url(mp3[:40], "audio/mpeg"), ref_text="hi")  # a header and no frames
    assert r.status_code == 400 and r.json()["error"]["param"] == "ref_audio", r.text
