"""Media in and out of the HTTP API.

Decoding: images / audio / video from ``data:`` URLs, ``http(s)://`` (httpx,
size-capped) and ``file://`` (only under ``--allowed-local-media-path``).
Encoding: PNG/JPEG/WebP images, WAV/FLAC/MP3/raw-PCM audio (soundfile) and
MP4 video (PyAV). Everything a client sends that cannot be decoded becomes a
400 naming the field; oversized inputs become 413.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
from PIL import Image, UnidentifiedImageError

from omnistage.server.errors import APIError, bad_request

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}
IMAGE_MIME = {"png": "image/png", "jpeg": "image/jpeg", "jpg": "image/jpeg", "webp": "image/webp"}
AUDIO_FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III")}
AUDIO_MIME = {"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "pcm": "audio/pcm"}


@dataclass
class MediaLimits:
    max_bytes: int = 20 << 20  # one decoded input (file, URL or data: payload)
    max_image_pixels: int = 4096 * 4096
    max_video_frames: int = 256
    fetch_timeout_s: float = 10.0
    allowed_local_media_path: Path | None = None


# --------------------------------------------------------------------------- fetching


def too_large(field: str, size: int, limit: int) -> APIError:
    return APIError(413, f"{field}: {size} bytes exceeds the limit of {limit} bytes", param=field, code="payload_too_large")


def decode_data_url(url: str, field: str, limits: MediaLimits) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:"):
        raise bad_request(f"{field}: malformed data: URL (expected data:<mime>;base64,<payload>)", field)
    if len(payload) * 3 // 4 > limits.max_bytes:
        raise too_large(field, len(payload) * 3 // 4, limits.max_bytes)
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"{field}: data: URL payload is not valid base64", field) from None
    return unquote(payload).encode("latin-1", errors="replace")


def decode_base64(data: str, field: str, limits: MediaLimits) -> bytes:
    if not isinstance(data, str):
        raise bad_request(f"{field}: expected a base64 string", field)
    if data.startswith("data:"):
        return decode_data_url(data, field, limits)
    if len(data) * 3 // 4 > limits.max_bytes:
        raise too_large(field, len(data) * 3 // 4, limits.max_bytes)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{field}: not valid base64", field) from None


def local_path(url: str, field: str, limits: MediaLimits) -> Path:
    """``file://`` URLs resolve (symlinks included) strictly inside the allowed folder."""
    root = limits.allowed_local_media_path
    if root is None:
        raise bad_request(f"{field}: file:// URLs are disabled (start the server with --allowed-local-media-path)",
                          field, code="local_media_not_allowed")
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise bad_request(f"{field}: file:// URL with a remote host is not allowed", field, code="local_media_not_allowed")
    path = Path(unquote(parsed.path)).resolve()
    if not path.is_relative_to(Path(root).resolve()):
        raise bad_request(f"{field}: {path} is outside the allowed local media path", field, code="local_media_not_allowed")
    if not path.is_file():
        raise bad_request(f"{field}: {path} does not exist", field)
    return path


async def fetch_bytes(url: Any, field: str, limits: MediaLimits) -> bytes:
    if not isinstance(url, str) or not url:
        raise bad_request(f"{field}: expected a URL string", field)
    scheme = urlparse(url).scheme.lower()
    if scheme == "data":
        return decode_data_url(url, field, limits)
    if scheme == "file":
        path = local_path(url, field, limits)
        size = path.stat().st_size
        if size > limits.max_bytes:
            raise too_large(field, size, limits.max_bytes)
        return path.read_bytes()
    if scheme in ("http", "https"):
        return await _download(url, field, limits)
    raise bad_request(f"{field}: unsupported URL scheme {scheme or '(none)'!r}; use data:, http(s):// or file://", field)


async def _download(url: str, field: str, limits: MediaLimits) -> bytes:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=limits.fetch_timeout_s, follow_redirects=True, max_redirects=3) as client:
            async with client.stream("GET", url) as resp:
                if resp.status_code != 200:
                    raise bad_request(f"{field}: fetching {url} answered HTTP {resp.status_code}", field)
                buf = bytearray()
                async for chunk in resp.aiter_bytes():
                    buf += chunk
                    if len(buf) > limits.max_bytes:
                        raise too_large(field, len(buf), limits.max_bytes)
                return bytes(buf)
    except httpx.HTTPError as e:
        raise bad_request(f"{field}: fetching {url} failed: {type(e).__name__}", field) from None


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
