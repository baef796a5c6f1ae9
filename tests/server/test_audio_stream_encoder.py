"""The streamed /v1/audio/speech body encoder: chunks in, bytes out as the format allows, and the
concatenated body decodes to the same samples as the whole clip encoded at once (FFmpeg through PyAV
and soundfile as the references, never the encoder under test)."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile

from omnistage.server.errors import APIError
from omnistage.server.media import AudioStreamEncoder

RATE = 16000
LAME_DELAY = 1105  # samples: LAME's encoder delay (576) + the MP3 decoder's (529)
SIZES = [640, 2560, 2560, 2560, 2560, 1920]  # a small first chunk, then larger ones (12800 samples)


def clip() -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(sum(SIZES)) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * rng.standard_normal(t.size)).astype(np.float32)


def streamed(fmt: str, audio: np.ndarray) -> list[bytes]:
    enc, out, i = AudioStreamEncoder(fmt, RATE), [], 0
    for n in SIZES:
        out.append(enc.encode(audio[i : i + n]))
        i += n
    return out + [enc.close()]


def int16(audio: np.ndarray) -> np.ndarray:
    return np.clip(np.round(audio.astype(np.float64) * 32768), -32768, 32767).astype(np.int16)  # media.to_int16's rule


def decode(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])


def mp3_at_once(samples: np.ndarray, bit_rate: int, rate: int = RATE) -> bytes:
    """The whole clip through FFmpeg's LAME in one frame (a seekable file: its LAME header records the
    encoder delay, so decoders trim it)."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp3") as container:
        stream = container.add_stream("libmp3lame", rate=rate, layout="mono")
        stream.bit_rate = bit_rate
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = rate, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return buf.getvalue()


def test_pcm_and_wav_send_every_chunk_at_once():
    audio = clip()
    pcm = streamed("pcm", audio)
    assert [len(p) for p in pcm] == [2 * n for n in SIZES] + [0]
    assert np.array_equal(np.frombuffer(b"".join(pcm), "<i2"), int16(audio))
    wav = streamed("wav", audio)
    assert len(wav[0]) == 44 + 2 * SIZES[0]
    back, rate = soundfile.read(io.BytesIO(b"".join(wav)), dtype="int16")
    assert rate == RATE and np.array_equal(back, int16(audio))


def test_flac_is_lossless_and_incremental():
    audio = clip()
    parts = streamed("flac", audio)
    assert sum(1 for p in parts[:-1] if p) >= 3  # bytes leave while chunks arrive, not only at close
    # FFmpeg's FLAC decoder (libsndfile takes the streamed STREAMINFO's unknown length for a huge one)
    got = decode(b"".join(parts))
    assert got.dtype == np.int16 and np.array_equal(got, int16(audio))


def test_mp3_streamed_equals_the_clip_encoded_at_once():
    audio = clip()
    parts = streamed("mp3", audio)
    assert sum(1 for p in parts[:-1] if p) >= 3
    got = decode(b"".join(parts))
    ref = decode(mp3_at_once(int16(audio), 64000))
    assert len(ref) == len(audio)
    # A streamed body cannot seek back to write the LAME header, so the encoder's delay stays in front.
    assert len(got) >= LAME_DELAY + len(ref)
    assert np.array_equal(got[LAME_DELAY : LAME_DELAY + len(ref)], ref)
    assert np.corrcoef(ref, audio)[0, 1] > 0.95  # and it is the clip


def test_an_unknown_format_names_the_field():
    with pytest.raises(APIError) as e:
        AudioStreamEncoder("opus", RATE)
    assert e.value.status == 400 and e.value.param == "response_format"
