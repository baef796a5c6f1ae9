"""Media in and out of the HTTP API.

Decoding: images / audio / video from ``data:`` URLs, ``http(s)://`` (httpx,
size-capped) and ``file://`` (only under ``--allowed-local-media-path``).
Checks for llm stages, which decode media themselves through vLLM: the bytes
decode, and travel on as a ``data:`` URL.
Encoding: PNG/JPEG/WebP images, WAV/FLAC/MP3/raw-PCM audio (soundfile) and
MP4 video (PyAV). Everything a client sends that cannot be decoded becomes a
400 naming the field; oversized inputs become 413.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from omnistage.server.errors import APIError, bad_request
from omnistage.server.media_fetch import (  # noqa: F401 - the fetching half, re-exported
    decode_base64,
    decode_data_url,
    fetch_bytes,
    local_path,
    too_large,
)

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}
IMAGE_MIME = {"png": "image/png", "jpeg": "image/jpeg", "jpg": "image/jpeg", "webp": "image/webp"}
AUDIO_FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III")}
AUDIO_MIME = {"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "pcm": "audio/pcm"}


@dataclass
class MediaLimits:
    max_bytes: int = 20 << 20  # one uploaded or inline input (multipart file, data: URL, base64, file://)
    max_image_pixels: int = 4096 * 4096
    max_video_frames: int = 256
    fetch_timeout_s: float = 10.0  # one http(s) download, start to end
    max_download_bytes: int = 20 << 20  # one http(s) download
    allowed_media_domains: frozenset[str] | None = None  # http(s) hosts media may come from (None: any)
    allowed_local_media_path: Path | None = None


# --------------------------------------------------------------------------- fetching
# media_fetch.py: data: URLs, base64, http(s) downloads and file:// paths, each bounded (re-exported here).


# --------------------------------------------------------------------------- decoding


def image_from_bytes(data: bytes, field: str, limits: MediaLimits) -> Image.Image:
    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size  # header only: check before decoding pixels (decompression bombs)
        if w * h > limits.max_image_pixels:
            raise APIError(413, f"{field}: image of {w}x{h} pixels exceeds the limit of {limits.max_image_pixels} pixels",
                           param=field, code="image_too_large")
        img.load()
        return img.convert("RGB")
    except APIError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise bad_request(f"{field}: not a decodable image ({type(e).__name__})", field) from None


async def load_image(url: Any, field: str, limits: MediaLimits) -> Image.Image:
    return image_from_bytes(await fetch_bytes(url, field, limits), field, limits)


def audio_from_bytes(data: bytes, field: str) -> tuple[np.ndarray, int]:
    import soundfile as sf

    try:
        audio, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise bad_request(f"{field}: not decodable audio ({type(e).__name__})", field) from None
    return audio.mean(axis=1).astype(np.float32), int(sr)  # mono


async def load_audio(url: Any, field: str, limits: MediaLimits) -> tuple[np.ndarray, int]:
    return audio_from_bytes(await fetch_bytes(url, field, limits), field)


def video_from_bytes(data: bytes, field: str, limits: MediaLimits) -> np.ndarray:
    import av

    frames = []
    try:
        with av.open(io.BytesIO(data)) as container:
            for frame in container.decode(video=0):
                frames.append(frame.to_ndarray(format="rgb24"))
                if len(frames) > limits.max_video_frames:
                    raise APIError(413, f"{field}: more than {limits.max_video_frames} frames", param=field)
    except APIError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError) as e:
        raise bad_request(f"{field}: not a decodable video ({type(e).__name__})", field) from None
    if not frames:
        raise bad_request(f"{field}: video has no frames", field)
    return np.stack(frames)


async def load_video(url: Any, field: str, limits: MediaLimits) -> np.ndarray:
    return video_from_bytes(await fetch_bytes(url, field, limits), field, limits)


# --------------------------------------------------------------------------- checks for llm stages
# An llm stage decodes its media itself, through vLLM's renderer (the model's own loaders and
# video frame sampling, exactly as `vllm serve`). For those the server fetches, checks that the
# bytes decode (so a bad part is a 400 naming it), and passes the bytes on as a data: URL.


def check_image(data: bytes, field: str, limits: MediaLimits) -> None:
    image_from_bytes(data, field, limits)


def check_audio(data: bytes, field: str) -> None:
    """Decodable by soundfile, or else by PyAV (vLLM's own order of audio decoders)."""
    try:
        audio_from_bytes(data, field)
        return
    except APIError:  # not a format soundfile reads (e.g. AAC): PyAV's turn
        pass
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise bad_request(f"{field}: not decodable audio (no audio stream)", field)
            for _ in container.decode(audio=0):
                return
    except APIError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError) as e:
        raise bad_request(f"{field}: not decodable audio ({type(e).__name__})", field) from None
    raise bad_request(f"{field}: audio has no samples", field)


def check_video(data: bytes, field: str) -> None:
    """A container PyAV opens, with a video stream whose first frame decodes (the stage samples frames)."""
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise bad_request(f"{field}: not a decodable video (no video stream)", field)
            for frame in container.decode(video=0):
                frame.to_ndarray(format="rgb24")
                return
    except APIError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError) as e:
        raise bad_request(f"{field}: not a decodable video ({type(e).__name__})", field) from None
    raise bad_request(f"{field}: video has no frames", field)


def as_data_url(url: str, data: bytes) -> str:
    """The client's own base64 ``data:`` URL as it is (no re-encoding); anything else (http(s),
    ``file://``, a percent-encoded ``data:``) as a base64 ``data:`` URL of the fetched bytes."""
    header, sep, _ = url.partition(",")
    if sep and header.startswith("data:") and header.endswith(";base64"):
        return url
    return data_url(data, "application/octet-stream")


# --------------------------------------------------------------------------- encoding


def encode_image(image: Image.Image, fmt: str = "png", quality: int | None = None) -> bytes:
    fmt = fmt.lower()
    if fmt not in IMAGE_FORMATS:
        raise bad_request(f"output_format: {fmt!r} is not one of png, jpeg, webp", "output_format")
    buf = io.BytesIO()
    kwargs: dict[str, Any] = {}
    if fmt in ("jpeg", "jpg", "webp") and quality is not None:
        kwargs["quality"] = int(quality)
    img = image.convert("RGB") if fmt in ("jpeg", "jpg") else image
    img.save(buf, format=IMAGE_FORMATS[fmt], **kwargs)
    return buf.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def pcm16(audio: np.ndarray) -> bytes:
    """float32 [-1, 1] -> little-endian signed 16-bit PCM."""
    arr = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return (arr * 32767.0).round().astype("<i2").tobytes()


def encode_audio(audio: np.ndarray, sample_rate: int, fmt: str = "wav") -> bytes:
    fmt = fmt.lower()
    if fmt == "pcm":
        return pcm16(audio)
    if fmt not in AUDIO_FORMATS:
        raise bad_request(f"response_format: {fmt!r} is not one of wav, pcm, flac, mp3", "response_format")
    import soundfile as sf

    container, subtype = AUDIO_FORMATS[fmt]
    buf = io.BytesIO()
    arr = np.clip(np.asarray(audio, dtype=np.float32).reshape(-1), -1.0, 1.0)
    sf.write(buf, arr, int(sample_rate), format=container, subtype=subtype)
    return buf.getvalue()


def encode_mp4(frames: np.ndarray, fps: float) -> bytes:
    """uint8 [T, H, W, 3] -> H.264 MP4 (odd sizes are padded by one pixel: yuv420p needs even sides)."""
    import av

    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"video frames must be uint8 [T,H,W,3], got {frames.dtype} {list(frames.shape)}")
    t, h, w, _ = frames.shape
    ph, pw = h + h % 2, w + w % 2
    if (ph, pw) != (h, w):
        frames = np.pad(frames, ((0, 0), (0, ph - h), (0, pw - w), (0, 0)), mode="edge")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = pw, ph, "yuv420p"
        for i in range(t):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frames[i]), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


# --------------------------------------------------------------------------- streamed audio encoding
# A streamed /v1/audio/speech body in any response_format, bytes out as soon as the format allows:
# pcm and wav (a header with "unknown length" sizes, then PCM16) send every chunk at once; flac and
# mp3 are encoded incrementally by FFmpeg through PyAV into a write-only sink (no seeking back: FLAC's
# STREAMINFO keeps its "unknown" total, as any streamed FLAC), each packet sent once the encoder
# emits it (mp3 holds back up to one 1152-sample frame plus the encoder's delay until the next chunk).

STREAM_CODECS = {"flac": "flac", "mp3": "libmp3lame"}


def wav_stream_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    """A 44-byte PCM WAV header for a body of unknown length (RIFF and data sizes 0xFFFFFFFF)."""
    import struct

    block = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


class _Sink:
    """A write-only file for PyAV: what the muxer wrote since the last ``take``."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def write(self, data: bytes) -> int:
        self.buf += bytes(data)
        return len(data)

    def take(self) -> bytes:
        out = bytes(self.buf)
        self.buf.clear()
        return out


class AudioStreamEncoder:
    """float32 mono chunks in, response body bytes out (``encode`` per chunk, then ``close``)."""

    def __init__(self, fmt: str, sample_rate: int):
        if fmt not in AUDIO_MIME:
            raise bad_request(f"response_format: {fmt!r} is not one of wav, pcm, flac, mp3", "response_format")
        self.fmt = fmt
        self.sample_rate = int(sample_rate)
        self._header = fmt == "wav"
        self._container: Any = None
        self._sink = _Sink()
        self._pts = 0
        if fmt in STREAM_CODECS:
            import av

            self._container = av.open(self._sink, mode="w", format=fmt)
            self._stream = self._container.add_stream(STREAM_CODECS[fmt], rate=self.sample_rate, layout="mono")
            if fmt == "mp3":  # LAME left alone picks ~24 kbit/s at 16 kHz (waveform correlation ~0.8 on noisy
                # speech); 64 kbit/s at MPEG-2 rates (< 32 kHz), 128 kbit/s above: ~0.99
                self._stream.bit_rate = 64000 if self.sample_rate < 32000 else 128000

    def encode(self, audio: np.ndarray) -> bytes:
        data = pcm16(audio)
        if self._container is None:
            head, self._header = (wav_stream_header(self.sample_rate) if self._header else b""), False
            return head + data
        import av

        samples = np.frombuffer(data, dtype="<i2").reshape(1, -1)
        if samples.size:
            frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.sample_rate, frame.pts = self.sample_rate, self._pts
            self._pts += samples.shape[1]
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()

    def close(self) -> bytes:
        """The rest of the body (the encoder's buffered frames and the container's trailer)."""
        if self._container is None:
            return wav_stream_header(self.sample_rate) if self._header else b""  # an empty WAV is still a WAV
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        self._container = None
        return self._sink.take()
