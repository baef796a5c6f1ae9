"""Offline audio at any rate: ``Omni.generate`` brings a ``multi_modal_data`` item ``(samples, rate)`` and an inline
chat audio part (``input_audio``) at another rate to the model's rate once (soxr HQ) before vLLM sees them
(vLLM's own resampler would want torchaudio, which is not installed). So a 44.1 kHz clip answers exactly as the
same clip resampled in the test (soxr) to the tiny Qwen2-Audio's 16 kHz, a 44.1 kHz stereo WAV or a 22.05 kHz MP3
in a chat message (inline, or an ``audio_url`` the engine fetches: ``file://`` under ``allowed_local_media_path``,
``http://``) as its content converted in the test (tests/e2e/media_matrix.py), and another clip otherwise."""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soxr

from omnistage import Omni
from tests.e2e import media_matrix as mm

from . import mm_cases

pytestmark = pytest.mark.vllm

MODEL_RATE = 16000  # the tiny Qwen2-Audio's WhisperFeatureExtractor


def clip(rate: int, seconds: float = 0.8) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    noise = np.random.default_rng(rate).standard_normal(t.size)
    return (0.3 * np.sin(2 * np.pi * 523.0 * t) + 0.05 * noise).astype(np.float32)


def prompt(audio: tuple[np.ndarray, int]) -> dict:
    return {"prompt": mm_cases.AUDIO_RAW["prompt"], "multi_modal_data": {"audio": audio}}


def chat(data: bytes, fmt: str) -> dict:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}
    return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "what is this sound"}]}]}


def url_chat(url: str) -> dict:
    part = {"type": "audio_url", "audio_url": {"url": url}}
    return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "what is this sound"}]}]}


@contextlib.contextmanager
def http_folder(folder: Path) -> Iterator[str]:
    """A plain HTTP server over ``folder`` on a free local port: the base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as srv:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{srv.server_address[1]}"
        finally:
            srv.shutdown()


def test_audio_at_another_rate_answers_as_it_resampled_to_the_model_rate(tiny_model, tmp_path):
    high, low = clip(44100), clip(8000)
    converted = soxr.resample(high, 44100, MODEL_RATE, quality="HQ").astype(np.float32)
    wav, mp3 = mm.AUDIO["wav_44k1_stereo"](), mm.AUDIO["mp3_22k05"]()
    prompts = [
        prompt((high, 44100)),
        prompt((converted, MODEL_RATE)),
        prompt((low, 8000)),
        chat(wav, "wav"),
        chat(mm.model_form_audio(wav, MODEL_RATE), "wav"),
        chat(mp3, "mp3"),
        chat(mm.model_form_audio(mp3, MODEL_RATE), "wav"),
    ]
    (tmp_path / "clip.wav").write_bytes(wav)
    (tmp_path / "clip.mp3").write_bytes(mp3)
    with (
        http_folder(tmp_path) as http_url,
        Omni(
            str(tiny_model("audio_lm")), engine_args={"allowed_local_media_path": str(tmp_path)}, **mm_cases.ENGINE
        ) as omni,
    ):
        prompts += [url_chat((tmp_path / "clip.wav").as_uri()), url_chat(f"{http_url}/clip.mp3")]
        outs = omni.generate(prompts, [dict(mm_cases.GREEDY)], use_tqdm=False)
    assert all(o.finished and o.error is None for o in outs), [o.error for o in outs]
    answers = [(o.text, o.num_prompt_tokens) for o in outs]
    assert answers[0][0] and answers[0] == answers[1]
    assert answers[0][0] != answers[2][0]  # another clip, another answer: the content reaches the model
    assert answers[3] == answers[4] and answers[5] == answers[6]
    assert answers[3][0] != answers[5][0]
    assert answers[7] == answers[4] and answers[8] == answers[6]  # fetched by the engine, converted as inline
