"""The awkward media users send, each beside the same content already in a model's form, converted here
with the libraries themselves (soundfile / PyAV to decode, soxr HQ to resample, diffusers' ``load_image`` for
images, PyAV for video), not with omnistage's code: the media matrix tests send both and expect one answer.

Audio: 44.1 kHz stereo WAV, 48 kHz 24-bit WAV, 8 kHz WAV, 22.05 kHz MP3, OGG/Opus, M4A/AAC, WebM/Opus ->
float32 mono at the model's rate (channels averaged, one soxr HQ resampling), sent as a 32-bit float WAV.
Lossy files are compared against what PyAV decodes from them, so the baseline holds the same samples.
Images: RGBA / LA / palette / 16-bit / 1-bit PNG, CMYK JPEG (PNG has no CMYK), EXIF-rotated JPEG, WebP,
animated GIF and WebP -> ``diffusers.utils.load_image`` (EXIF orientation, then ``convert("RGB")``) of the
first frame, sent as PNG. Video: H.265 (MP4) and VP9 (WebM) at 30 and 12.5 fps -> the frames PyAV decodes,
re-encoded losslessly (H.264 RGB, qp 0) at the same frame rate.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from fractions import Fraction

import av
import numpy as np
import soundfile
import soxr
from PIL import Image

# --------------------------------------------------------------------------- audio


def signal(seed: int, rate: int, seconds: float, channels: int) -> np.ndarray:
    """float32 [channels, samples]: a tone per channel (its pitch from the seed) over a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    pitch = rng.uniform(200, 3000, size=(channels, 1))
    return (0.3 * np.sin(2 * np.pi * pitch * t) + 0.05 * rng.standard_normal((channels, t.size))).astype(np.float32)


def wav(sig: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, sig.T, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def encoded(sig: np.ndarray, rate: int, codec: str, container: str) -> bytes:
    """``sig`` through an FFmpeg encoder (PyAV), as a recorder or a browser writes it."""
    layout = "mono" if sig.shape[0] == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        step = 960  # a multiple of nothing in particular: PyAV re-frames for the encoder
        for start in range(0, sig.shape[1], step):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(sig[:, start : start + step]), "fltp", layout)
            frame.sample_rate, frame.pts = rate, start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def decoded(data: bytes) -> tuple[np.ndarray, int]:
    """float32 [channels, samples] and the rate, as libsndfile (WAV) or FFmpeg (everything else) decodes it."""
    if data[:4] == b"RIFF":
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        return samples.T, rate
    pieces, rate = [], 0
    with av.open(io.BytesIO(data)) as container:
        to_float = av.AudioResampler(format="fltp")  # planar float, channels and rate kept
        for frame in container.decode(audio=0):
            for out in to_float.resample(frame):
                rate = out.sample_rate
                pieces.append(out.to_ndarray())
    return np.concatenate(pieces, axis=1), rate


def model_form_audio(data: bytes, model_rate: int) -> bytes:
    """The content of ``data`` as the model hears it: channels averaged, soxr HQ to ``model_rate``, float WAV."""
    samples, rate = decoded(data)
    mono = samples.mean(axis=0, dtype=np.float32)
    if rate != model_rate:
        mono = soxr.resample(mono, rate, model_rate, quality="HQ").astype(np.float32)
    buf = io.BytesIO()
    soundfile.write(buf, mono, model_rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


AUDIO: dict[str, Callable[[], bytes]] = {
    "wav_44k1_stereo": lambda: wav(signal(1, 44100, 0.9, 2), 44100),
    "wav_48k_24bit": lambda: wav(signal(2, 48000, 0.7, 1), 48000, "PCM_24"),
    "wav_8k": lambda: wav(signal(3, 8000, 1.1, 1), 8000),
    "mp3_22k05": lambda: encoded(signal(4, 22050, 0.8, 1), 22050, "libmp3lame", "mp3"),
    "ogg_opus": lambda: encoded(signal(5, 48000, 1.0, 1), 48000, "libopus", "ogg"),
    "m4a_aac": lambda: encoded(signal(6, 44100, 0.6, 2), 44100, "aac", "ipod"),
    "webm_opus": lambda: encoded(signal(7, 48000, 1.2, 2), 48000, "libopus", "webm"),
}

# --------------------------------------------------------------------------- images


def _pixels(seed: int, w: int, h: int) -> np.ndarray:
    """Smooth colour ramps with a little noise: both a lossy codec and the model see structure."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    ramps = np.stack([x * 5 + rng.integers(0, 256), y * 7 + rng.integers(0, 256), (x + y) * 3], -1)
    return ((ramps + rng.integers(0, 24, size=(h, w, 3))) % 256).astype(np.uint8)


def _save(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _rgba() -> bytes:
    alpha = np.random.default_rng(11).integers(0, 256, size=(40, 56), dtype=np.uint8)
    return _save(Image.fromarray(np.dstack([_pixels(11, 56, 40), alpha]), "RGBA"), "PNG")


def _exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the camera was turned; viewers rotate 90 degrees clockwise
    return _save(Image.fromarray(_pixels(16, 56, 32)), "JPEG", quality=90, exif=exif)


def _animated(fmt: str, seed: int) -> bytes:
    frames = [Image.fromarray(_pixels(seed + i, 48, 40)) for i in range(3)]
    return _save(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)


IMAGES: dict[str, Callable[[], bytes]] = {
    "png_rgba": _rgba,
    "png_la": lambda: _save(Image.fromarray(_pixels(12, 48, 48)).convert("LA"), "PNG"),
    "png_palette": lambda: _save(Image.fromarray(_pixels(13, 56, 40)).quantize(32), "PNG", transparency=0),
    "png_16bit": lambda: _save(
        Image.fromarray(np.random.default_rng(14).integers(0, 400, size=(40, 48)).astype(np.uint16)), "PNG"
    ),  # gray I;16: PIL's convert("RGB") clips at 255
    "png_1bit": lambda: _save(Image.fromarray(_pixels(15, 48, 40)).convert("1"), "PNG"),
    "jpeg_cmyk": lambda: _save(Image.fromarray(_pixels(17, 48, 40)).convert("CMYK"), "JPEG", quality=90),
    "jpeg_exif_rotated": _exif_rotated,
    "webp": lambda: _save(Image.fromarray(_pixels(18, 56, 40)), "WEBP", quality=80),
    "gif_animated": lambda: _animated("GIF", 20),
    "webp_animated": lambda: _animated("WEBP", 30),
}


def model_form_image(data: bytes) -> bytes:
    """diffusers' own ``load_image`` (EXIF orientation, then ``convert("RGB")``) of the first frame, as PNG."""
    from diffusers.utils import load_image

    return _save(load_image(Image.open(io.BytesIO(data))), "PNG")


# --------------------------------------------------------------------------- video


def frames(seed: int, count: int, w: int = 64, h: int = 48) -> np.ndarray:
    """uint8 [T, H, W, 3]: colour ramps that move from frame to frame."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = rng.integers(0, 256, size=3)
    out = [(base + np.stack([x * 3 + 20 * t, y * 3 - 15 * t, (x + y) * 2 + 25 * t], -1)) % 256 for t in range(count)]
    return np.stack(out).astype(np.uint8)


def video(pixels: np.ndarray, fps: float, codec: str, container: str, **options: str) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=Fraction(fps).limit_denominator(1000), options=options)
        stream.width, stream.height = pixels.shape[2], pixels.shape[1]
        stream.pix_fmt = "rgb24" if codec == "libx264rgb" else "yuv420p"
        for image in pixels:
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


VIDEOS: dict[str, Callable[[], bytes]] = {
    "h265_30fps": lambda: video(frames(41, 24), 30, "libx265", "mp4"),
    "h265_12_5fps": lambda: video(frames(42, 20), 12.5, "libx265", "mp4"),
    "vp9_30fps": lambda: video(frames(43, 24), 30, "libvpx-vp9", "webm"),
    "vp9_12_5fps": lambda: video(frames(44, 20), 12.5, "libvpx-vp9", "webm"),
}
VIDEO_ENCODERS = {"libx265", "libvpx-vp9", "libx264rgb"}


def model_form_video(data: bytes) -> bytes:
    """The frames PyAV decodes from ``data`` (RGB), losslessly re-encoded at the same frame rate."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        fps = stream.average_rate
        pixels = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
    return video(pixels, fps, "libx264rgb", "mp4", qp="0")
