"""The transcription routes' pieces without an engine: windows cut exactly where vLLM's own
``split_audio`` cuts (``vllm serve``'s long-audio path), the PyAV + soxr decoder against soundfile /
soxr themselves, and the response formats."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from omnistage.media.audio import decode_audio
from omnistage.server.errors import APIError
from omnistage.server.recognition import windows
from omnistage.server.transcripts import Segment, Transcript


@pytest.mark.parametrize("seconds", [0.5, 30.0, 30.01, 65.0, 95.0, 121.3])
def test_windows_cut_where_vllm_cuts(seconds):
    from vllm.multimodal.audio import split_audio

    rng = np.random.default_rng(int(seconds * 10))
    n = int(seconds * 16000)
    x = (rng.standard_normal(n) * np.linspace(0.05, 1, n)).astype(np.float32)
    x[rng.integers(0, n, 50)] = 0.0
    ours = windows(x, 16000, 30)
    theirs = split_audio(x, 16000, 30, 1, 1600) if n > 30 * 16000 else [x]
    assert [p.size for _, p in ours] == [p.size for p in theirs]
    assert all(np.array_equal(a, b) for (_, a), b in zip(ours, theirs))
    offsets = [o for o, _ in ours]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert offsets[-1] + ours[-1][1].size / 16000 == pytest.approx(seconds, abs=1e-4)


def _encoded(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def test_decoder_keeps_16k_pcm_samples_and_resamples_others():
    import soxr

    rng = np.random.default_rng(0)
    mono = (0.3 * rng.standard_normal(16000)).astype(np.float32)
    data = _encoded(mono, 16000, "WAV", "PCM_16")
    assert np.array_equal(decode_audio(data, "file", 16000, 60), sf.read(io.BytesIO(data), dtype="float32")[0])
    stereo = (0.3 * rng.standard_normal((44100, 2))).astype(np.float32)
    data = _encoded(stereo, 44100, "FLAC")
    heard = sf.read(io.BytesIO(data), dtype="float32")[0].mean(axis=1)
    expected = soxr.resample(heard, 44100, 16000, quality="HQ")
    np.testing.assert_allclose(decode_audio(data, "file", 16000, 60), expected, atol=1e-6)


@pytest.mark.parametrize(
    "data, words", [(b"not audio at all", "not a decodable audio file"), (b"", "not a decodable audio file")]
)
def test_decoder_refuses_what_is_not_audio(data, words):
    with pytest.raises(APIError) as e:
        decode_audio(data, "file", 16000, 60)
    assert e.value.status == 400 and e.value.param == "file" and words in e.value.message


def test_decoder_refuses_audio_over_the_limit():
    data = _encoded(np.zeros(16000 * 3, np.float32), 16000, "WAV", "PCM_16")
    with pytest.raises(APIError) as e:
        decode_audio(data, "file", 16000, max_seconds=2)
    assert e.value.status == 400 and e.value.param == "file" and "longer than 2 s" in e.value.message


def test_formats():
    t = Transcript("transcribe", "en", 61.5, [Segment(0.0, 29.5, " hello"), Segment(29.5, 61.5, " world", [7])])
    assert t.text == " hello  world"
    assert t.render("text") == " hello  world"
    assert t.render("srt") == ("1\n00:00:00,000 --> 00:00:29,500\nhello\n\n2\n00:00:29,500 --> 00:01:01,500\nworld\n\n")
    assert (
        t.render("vtt") == "WEBVTT\n\n00:00:00.000 --> 00:00:29.500\nhello\n\n00:00:29.500 --> 00:01:01.500\nworld\n\n"
    )
    v = t.render("verbose_json")
    assert [(s["id"], s["start"], s["end"], s["tokens"]) for s in v["segments"]] == [
        (0, 0.0, 29.5, []),
        (1, 29.5, 61.5, [7]),
    ]
    assert t.render("json") == {"text": " hello  world", "usage": {"type": "duration", "seconds": 61.5}}
