"""The server's MP4 writer (``encode_mp4``) checked against its input, not against itself: real content (gradients
moving at different speeds, a sharp-edged square crossing them, 3 s, sizes not multiples of 16, one odd), decoded with
PyAV, compared frame by frame with the frames it was given, and its AAC track with the waveform it was given.

What "the same" means through the two lossy steps (measured on this content, PyAV 18 / FFmpeg's libx264 and native
AAC): yuv420p alone (BT.601, chroma at half resolution) puts frames mean 4.0 levels off (max 103, at the square's
coloured edges); H.264 on top of that adds mean 2.7 (p99 13, max 55) and its frames are then mean <= 5.7 from their own
input frame, while the nearest other input frame is mean >= 16.9 away. The AAC track at the writer's 128 kbit/s per
channel decodes aligned (FFmpeg trims the encoder's priming samples) to within 0.053 (16 kHz) / 0.081 (24 kHz) of
every input sample, RMS 0.9-1.5% of the signal's, while the same waveform 37 samples later is 0.44 away.
"""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest

from omnistage.server.media import encode_mp4

FPS = 12
SECONDS = 3


def moving_content(t: int, h: int, w: int) -> np.ndarray:
    """uint8 [t, h, w, 3]: red a gradient moving right, green one moving down, blue a still ramp, and a white
    square with a black centre that moves 2 px right and 1 px down per frame (every frame differs from the next)."""
    tt = np.arange(t)[:, None, None] / FPS
    y, x = np.arange(h)[None, :, None], np.arange(w)[None, None, :]
    shape = (t, h, w)
    img = np.stack(
        [
            np.broadcast_to(127.5 + 127.5 * np.sin(2 * np.pi * (x / w - 0.5 * tt)), shape),
            np.broadcast_to(127.5 + 127.5 * np.cos(2 * np.pi * (y / h + 0.3 * tt)), shape),
            np.broadcast_to(255.0 * x / (w - 1), shape),
        ],
        -1,
    )
    for i in range(t):
        x0, y0 = (2 * i) % (w - 10), i % (h - 8)
        img[i, y0 : y0 + 8, x0 : x0 + 10] = 255
        img[i, y0 + 2 : y0 + 6, x0 + 2 : x0 + 8] = 0
    return np.round(img).astype(np.uint8)


def waveform(rate: int, channels: int, seconds: float) -> np.ndarray:
    """float32 [channels, samples]: a tone plus a chirp (200 Hz rising 1200 Hz/s), and a decaying lower tone."""
    ts = np.arange(int(rate * seconds)) / rate
    left = 0.4 * np.sin(2 * np.pi * 440 * ts) + 0.2 * np.sin(2 * np.pi * (200 * ts + 600 * ts**2))
    right = 0.3 * np.sin(2 * np.pi * 300 * ts) * np.exp(-ts)
    return np.stack([left, right])[:channels].astype(np.float32)


def decode(data: bytes) -> dict:
    with av.open(io.BytesIO(data)) as c:
        v = c.streams.video[0]
        out = {
            "frames": np.stack([f.to_ndarray(format="rgb24") for f in c.decode(v)]),
            "fps": v.average_rate,
            "codec": v.codec_context.name,
            "audio": None,
        }
        if c.streams.audio:
            a = c.streams.audio[0]
            out.update(
                rate=a.rate, channels=a.channels, duration=a.duration * a.time_base, audio_codec=a.codec_context.name
            )
            c.seek(0)
            out["audio"] = np.concatenate([f.to_ndarray() for f in c.decode(a)], axis=1)
    return out


def through_yuv420p(frames: np.ndarray) -> np.ndarray:
    """What the frames become through the colour conversion alone (PyAV's own, as the writer's encoder gets them)."""
    return np.stack(
        [
            av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p").to_ndarray(format="rgb24")
            for f in frames
        ]
    )


@pytest.mark.parametrize("h, w", [(38, 66), (37, 67)])
def test_video_decodes_to_the_input_frames_in_order(h, w):
    frames = moving_content(FPS * SECONDS, h, w)
    got = decode(encode_mp4(frames, FPS))
    ph, pw = h + h % 2, w + w % 2  # yuv420p needs even sides: an odd one is padded by one pixel
    assert got["codec"] == "h264" and got["fps"] == Fraction(FPS) and got["audio"] is None
    assert got["frames"].shape == (len(frames), ph, pw, 3)

    # within H.264's spread of what the colour conversion alone makes of the input (measured mean 2.7, max 55)
    padded = np.pad(frames, ((0, 0), (0, ph - h), (0, pw - w), (0, 0)), mode="edge")
    codec = np.abs(got["frames"].astype(int) - through_yuv420p(padded).astype(int))
    assert codec.mean() < 4.0 and codec.max() <= 80, (codec.mean(), codec.max())

    # frame order and count: each decoded frame is nearest its own input frame, by a wide margin (5.7 vs 16.9)
    dist = np.abs(got["frames"][:, None, :h, :w].astype(np.int16) - frames[None].astype(np.int16)).mean(axis=(2, 3, 4))
    own = np.diag(dist)
    others = np.where(np.eye(len(frames), dtype=bool), np.inf, dist).min(axis=1)
    assert (own < 8.0).all() and (others > 12.0).all(), (own.max(), others.min())


@pytest.mark.parametrize(
    "rate, channels, max_err, rms_err", [(16000, 1, 0.08, 0.03), (16000, 2, 0.08, 0.03), (24000, 2, 0.12, 0.03)]
)
def test_aac_track_decodes_to_the_input_waveform(rate, channels, max_err, rms_err):
    seconds = 2.5
    wave = waveform(rate, channels, seconds)
    got = decode(encode_mp4(moving_content(int(FPS * seconds), 38, 66), FPS, wave, rate))
    n = wave.shape[1]
    assert got["audio_codec"] == "aac" and got["rate"] == rate and got["channels"] == channels
    assert got["duration"] == Fraction(n, rate)  # the stream lasts as long as the waveform
    audio = got["audio"]
    assert audio.shape == (channels, -(-n // 1024) * 1024)  # whole 1024-sample AAC frames: the last one padded

    # aligned: the correlation peaks at lag 0 (the encoder's priming samples are trimmed on decoding)
    lags = range(-2048, 2049)
    corr = [
        float(np.dot(audio[0, max(k, 0) : max(k, 0) + rate], wave[0, max(-k, 0) : max(-k, 0) + rate])) for k in lags
    ]
    assert lags[int(np.argmax(corr))] == 0

    err = audio[:, :n] - wave
    assert np.abs(err).max() < max_err, np.abs(err).max()  # measured 0.053 (16 kHz), 0.081 (24 kHz)
    assert np.sqrt((err**2).mean()) < rms_err * np.sqrt((wave**2).mean())  # measured 0.9-1.5%
    assert np.abs(audio[:, :n] - np.roll(wave, 37, axis=1)).max() > 0.3  # (the same signal 37 samples late: 0.44)
    assert np.abs(audio[:, n:]).max() < 0.01  # the padding is near silence (measured 0.0017 / 0.0038)
