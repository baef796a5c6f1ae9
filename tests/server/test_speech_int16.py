"""One int16 conversion for every audio answer: for one request, /v1/audio/speech as pcm, wav and flac (whole
and streamed), its SSE deltas, and /v1/chat/completions audio (whole WAV and streamed pcm16 deltas) decode to
the same int16 samples, which are round(x * 32768) of the stage's float waveform (computed here from the
test pipeline's own tone adapter); mp3 is within its codec's tolerance. Decoders: soundfile, FFmpeg (PyAV)."""

from __future__ import annotations

import base64
import io
import json
from types import SimpleNamespace

import av
import numpy as np
import pytest
import soundfile

from tests.server.conftest import new_engine
from tests.server.pipelines import ToneAdapter, omni_pipeline

TEXT = "one two three"
SPOKEN = "echo " + TEXT  # what the word engine replies; the tone stage speaks each word


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory(new_engine(omni_pipeline()))


@pytest.fixture(scope="module")
def expected() -> np.ndarray:
    [out] = ToneAdapter(None).run([SimpleNamespace(inputs={"text": SPOKEN})])
    x = out["audio"].numpy().astype(np.float64)
    return np.clip(np.round(x * 32768), -32768, 32767).astype(np.int16)


def speech(srv, fmt: str, stream: bool = False) -> bytes:
    body = {"input": TEXT, "voice": "alto", "response_format": fmt, "stream": stream}
    r = srv.client().post("/v1/audio/speech", json=body)
    assert r.status_code == 200, r.text
    return r.content


def ffmpeg_int16(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as c:
        return np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(audio=0)])


@pytest.mark.parametrize("stream", [False, True])
def test_pcm_wav_flac_are_the_same_int16(srv, expected, stream):
    pcm = np.frombuffer(speech(srv, "pcm", stream), "<i2")
    wav, rate = soundfile.read(io.BytesIO(speech(srv, "wav", stream)), dtype="int16")
    flac_bytes = speech(srv, "flac", stream)
    # a streamed FLAC keeps STREAMINFO's "unknown" length, which libsndfile misreads: FFmpeg decodes it
    flac = ffmpeg_int16(flac_bytes) if stream else soundfile.read(io.BytesIO(flac_bytes), dtype="int16")[0]
    assert rate == 16000
    for name, got in (("pcm", pcm), ("wav", wav), ("flac", flac)):
        assert got.dtype == np.int16 and np.array_equal(got, expected), name


def test_mp3_within_codec_tolerance(srv, expected):
    got = ffmpeg_int16(speech(srv, "mp3")).astype(np.float64) / 32768
    ref = expected.astype(np.float64) / 32768
    # FFmpeg keeps the encoder's delay in front when no LAME header says it: align on the best lag
    lag = max(range(0, 2400), key=lambda k: float(np.dot(got[k : k + ref.size], ref[: got[k:].size])))
    part = got[lag : lag + ref.size]
    assert part.size >= 0.95 * ref.size
    assert np.corrcoef(part, ref[: part.size])[0, 1] > 0.98


def test_sse_and_chat_audio_use_the_same_conversion(srv, expected):
    c = srv.client()
    with c.stream(
        "POST", "/v1/audio/speech", json={"input": TEXT, "voice": "alto", "stream": True, "stream_format": "sse"}
    ) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    sse = np.frombuffer(
        b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"), "<i2"
    )
    assert np.array_equal(sse, expected)

    body = {
        "messages": [{"role": "user", "content": TEXT}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "alto", "format": "wav"},
    }
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    wav, _ = soundfile.read(
        io.BytesIO(base64.b64decode(r.json()["choices"][0]["message"]["audio"]["data"])), dtype="int16"
    )
    assert np.array_equal(wav, expected)
    deltas = []
    with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                choices = json.loads(line[5:])["choices"]
                audio = choices[0]["delta"].get("audio") if choices else None
                if audio and audio.get("data"):
                    deltas.append(base64.b64decode(audio["data"]))
    assert np.array_equal(np.frombuffer(b"".join(deltas), "<i2"), expected)
