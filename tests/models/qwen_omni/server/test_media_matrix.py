"""The media matrix on Qwen3-Omni over HTTP (chat ``input_audio`` / ``audio_url`` / ``image_url`` /
``video_url`` parts and ``/v1/audio/transcriptions``): every awkward input of tests/e2e/media_matrix.py gives,
greedy, exactly the answer (text and prompt tokens) that the same content already in the model's form gives
(16 kHz mono float WAV, RGB PNG, losslessly re-encoded frames at the same rate), converted in the test by
soundfile / PyAV / soxr / diffusers. Audio at any rate reaches the model resampled once, before vLLM sees it
(vLLM's own resampler would want torchaudio, which is not installed). Broken or hostile files stay 400s naming
the part. The server (``omni_server``) is this package's (conftest.py)."""

from __future__ import annotations

import base64

import httpx
import pytest

from omnistage.testing.requires import requires_encoder
from tests.e2e import media_matrix as mm

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MODEL_RATE = 16000  # the tiny Qwen3-Omni's WhisperFeatureExtractor (its preprocessor_config.json)
GREEDY = {"model": "tiny-omni", "modalities": ["text"], "temperature": 0, "max_tokens": 10}
MIME = {"wav": "audio/wav", "mp3": "audio/mpeg", "ogg": "audio/ogg", "m4a": "audio/mp4", "webm": "audio/webm"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def ask(url: str, part: dict, text: str = "what is this?") -> httpx.Response:
    body = {**GREEDY, "messages": [{"role": "user", "content": [part, {"type": "text", "text": text}]}]}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)


def answer(url: str, part: dict) -> tuple[str, int]:
    resp = ask(url, part)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    return body["choices"][0]["message"]["content"], body["usage"]["prompt_tokens"]


def input_audio(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}}


def url_part(kind: str, data: bytes, mime: str) -> dict:
    return {"type": kind, kind: {"url": f"data:{mime};base64,{b64(data)}"}}


AUDIO_ENCODERS = {"mp3_22k05": "libmp3lame", "ogg_opus": "libopus", "m4a_aac": "aac", "webm_opus": "libopus"}
# the encoders that make the inputs
requires_audio_encoders = requires_encoder(*AUDIO_ENCODERS.values())
requires_video_encoders = requires_encoder(*mm.VIDEO_ENCODERS)


@requires_audio_encoders
def test_audio_at_any_rate_and_container_answers_as_its_content_at_the_model_rate(omni_server):
    answers = {}
    for name, make in mm.AUDIO.items():
        data = make()
        want = answer(omni_server, input_audio(mm.model_form_audio(data, MODEL_RATE)))
        fmt = name.split("_")[0]
        got = answer(omni_server, input_audio(data, fmt))
        assert got == want, name
        if name in ("wav_44k1_stereo", "mp3_22k05", "m4a_aac"):  # the same through audio_url
            assert answer(omni_server, url_part("audio_url", data, MIME[fmt])) == want, name
        answers[name] = want
    assert len(set(answers.values())) > 1, answers  # the model hears the content: different clips, answers


def test_images_in_any_mode_answer_as_diffusers_load_image_of_them(omni_server):
    answers = {}
    for name, make in mm.IMAGES.items():
        data = make()
        want = answer(omni_server, url_part("image_url", mm.model_form_image(data), "image/png"))
        got = answer(omni_server, url_part("image_url", data, "image/" + name.split("_")[0]))
        assert got == want, name
        answers[name] = want
    assert len(set(answers.values())) > 1, answers


@requires_video_encoders
def test_h265_and_vp9_video_at_30_and_12_5_fps_answer_as_their_frames(omni_server):
    answers = {}
    for name, make in mm.VIDEOS.items():
        data = make()
        want = answer(omni_server, url_part("video_url", mm.model_form_video(data), "video/mp4"))
        got = answer(omni_server, url_part("video_url", data, "video/webm" if "vp9" in name else "video/mp4"))
        assert got == want, name
        answers[name] = want
    assert len(set(answers.values())) > 1, answers


@requires_audio_encoders
def test_transcription_of_any_audio_equals_that_of_its_content_at_the_model_rate(omni_server):
    import openai

    client = openai.OpenAI(base_url=f"{omni_server}/v1", api_key="x", max_retries=0, timeout=300)

    def text(name: str, data: bytes, mime: str) -> str:
        extra = {"max_tokens": 8, "temperature": 0}
        return client.audio.transcriptions.create(
            model="tiny-omni", file=(name, data, mime), language="en", extra_body=extra
        ).text

    texts = {}
    for name, make in mm.AUDIO.items():
        data = make()
        fmt = name.split("_")[0]
        want = text("base.wav", mm.model_form_audio(data, MODEL_RATE), "audio/wav")
        assert text(f"clip.{fmt}", data, MIME[fmt]) == want, name
        texts[name] = want
    assert len(set(texts.values())) > 1, texts


def test_broken_and_hostile_media_stay_400s_naming_the_part(omni_server):
    good = mm.AUDIO["wav_44k1_stereo"]()
    truncated = good[: len(good) // 2]  # the header still declares the whole clip
    resp = ask(omni_server, input_audio(truncated))
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "truncated_media"
    assert resp.json()["error"]["param"] == "messages[0].content[0].input_audio"
    for part in (
        input_audio(b"not audio at all" * 20),
        url_part("image_url", b"\x89PNG\r\n\x1a\n" + b"x" * 64, "image/png"),
    ):
        resp = ask(omni_server, part)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"].startswith("messages[0].content[0].")
    assert ask(omni_server, input_audio(mm.model_form_audio(good, MODEL_RATE))).status_code == 200  # still serving
