"""Media in and out of the HTTP API.

Decoding: images / audio / video from ``data:`` URLs, ``http(s)://`` (httpx,
size-capped) and ``file://`` (only under ``--allowed-local-media-path``).
Decoding is bounded by media/decode.py; what is decoded takes the one normal
form of media_intake.py (audio at the model's rate, RGB images) before any
stage sees it, also for llm stages (whose loader then reads it back unchanged).
Encoding: PNG/JPEG/WebP images, WAV/FLAC/MP3/raw-PCM audio (soundfile) and
MP4 video (PyAV). Everything a client sends that cannot be decoded becomes a
400 naming the field; oversized inputs become 413.
"""

from __future__ import annotations

import asyncio
import base64
import io
from fractions import Fraction
from typing import Any

import numpy as np
from PIL import Image

from omnistage.media.audio import decode_audio, decode_native
from omnistage.media.audio_decode import decode_audio_av, read_audio
from omnistage.media.decode import open_image, open_video
from omnistage.media_intake import png_bytes, wav_bytes
from omnistage.server.errors import APIError, bad_request
from omnistage.server.media_fetch import (  # noqa: F401 - the fetching half (and the limits), re-exported
    Fetched,
    MediaLimits,
    decode_base64,
    decode_data_url,
    fetch_bytes,
    fetch_media,
    local_path,
    too_large,
)

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}
IMAGE_MIME = {"png": "image/png", "jpeg": "image/jpeg", "jpg": "image/jpeg", "webp": "image/webp"}
AUDIO_FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III")}
AUDIO_MIME = {"wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg", "pcm": "audio/pcm"}


# --------------------------------------------------------------------------- fetching
# media_fetch.py: data: URLs, base64, http(s) downloads and file:// paths, each bounded (re-exported here).


# --------------------------------------------------------------------------- decoding
# media/decode.py: every decode is checked from the header first and bounded while it runs.


def image_from_bytes(
    data: bytes, field: str, limits: MediaLimits, mime: str | None = None, mode: str = "RGB"
) -> Image.Image:
    return open_image(data, field, limits, mime, mode)


async def load_image(url: Any, field: str, limits: MediaLimits, mode: str = "RGB") -> Image.Image:
    got = await fetch_media(url, field, limits)
    return await asyncio.to_thread(open_image, got.data, field, limits, got.mime, mode)


def audio_from_bytes(
    data: bytes, field: str, limits: MediaLimits | None = None, max_s: float | None = None, mime: str | None = None
) -> tuple[np.ndarray, int]:
    """Float32 mono (channels averaged) and the native rate, decoded as every audio input is (audio_input.py:
    libsndfile for WAV / FLAC, PyAV for the rest); undecodable bytes get the verdict every audio check gives."""
    limits = limits or MediaLimits()
    try:
        return decode_native(data, field, max_s, limits, mime)
    except APIError as e:
        if e.status == 400 and e.code is None:
            check_audio(data, field, limits, mime)
        raise


async def load_audio(url: Any, field: str, limits: MediaLimits) -> tuple[np.ndarray, int]:
    got = await fetch_media(url, field, limits)
    return await asyncio.to_thread(audio_from_bytes, got.data, field, limits, None, got.mime)


def video_from_bytes(data: bytes, field: str, limits: MediaLimits, mime: str | None = None) -> np.ndarray:
    return open_video(data, field, limits, limits.max_video_frames, mime)


async def load_video(url: Any, field: str, limits: MediaLimits) -> np.ndarray:
    got = await fetch_media(url, field, limits)
    return await asyncio.to_thread(video_from_bytes, got.data, field, limits, got.mime)


# --------------------------------------------------------------------------- checks for llm stages
# An llm stage loads its media through vLLM's renderer (the model's own loaders and video frame
# sampling, exactly as `vllm serve`). For those the server fetches and decodes within the limits (so a
# bad part is a 4xx naming it) and passes the media on as a data: URL in the model's form
# (model_form_part): vLLM then neither converts images nor resamples audio.


def check_image(data: bytes, field: str, limits: MediaLimits, mime: str | None = None) -> None:
    open_image(data, field, limits, mime)


def check_audio(data: bytes, field: str, limits: MediaLimits | None = None, mime: str | None = None) -> None:
    """Decodable by soundfile, or else by PyAV (vLLM's own order of audio decoders), within the limits."""
    limits = limits or MediaLimits()
    try:
        read_audio(data, field, limits, None, mime)
        return
    except APIError as e:
        if e.status != 400 or e.code is not None:  # over a limit, the wrong type, truncated: final
            raise
        first = e
    try:
        decode_audio_av(data, field, limits, None, mime)  # not a format soundfile reads (e.g. AAC): PyAV's turn
    except APIError as e:
        raise (e if e.code is not None else first) from None


def check_video(data: bytes, field: str, limits: MediaLimits | None = None, mime: str | None = None) -> None:
    """A container PyAV opens whose header is within the limits, with a video stream whose first frame
    decodes (the stage samples frames)."""
    open_video(data, field, limits or MediaLimits(), None, mime)


def model_form_part(
    kind: str, data: bytes, field: str, limits: MediaLimits, audio_rate: int, mime: str | None = None, url: str = ""
) -> dict[str, Any]:
    """One chat media part as an llm stage's loader (vLLM's) reads it back already in the model's form, so the
    engine converts nothing (media_intake.py): audio decoded within the limits, channels averaged and resampled
    once (soxr HQ) to ``audio_rate``, as a float WAV; an image as an RGB PNG (EXIF orientation applied, first
    frame); a video checked and passed on as sent (vLLM's OpenCV decoder and PyAV give the same frames for the
    codecs FFmpeg decodes, at the video's own frame rate)."""
    if kind in ("input_audio", "audio_url"):
        try:
            samples = decode_audio(data, field, audio_rate, limits.max_audio_s, limits, mime)
        except APIError as e:
            if e.status == 400 and e.code is None:  # undecodable: the verdict every audio check gives
                check_audio(data, field, limits, mime)
            raise
        if not samples.size:
            raise bad_request(f"{field}: the audio has no samples", field)
        wav = wav_bytes(samples, audio_rate)
        if kind == "input_audio":
            return {"input_audio": {"data": b64(wav), "format": "wav"}}
        return {"audio_url": {"url": data_url(wav, "audio/wav")}}
    if kind == "image_url":
        return {"image_url": {"url": data_url(png_bytes(open_image(data, field, limits, mime)), "image/png")}}
    check_video(data, field, limits, mime)
    return {kind: {"url": as_data_url(url, data)}}


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


def to_int16(audio: Any) -> np.ndarray:
    """float32 [-1, 1] -> int16, the one conversion behind every audio answer (pcm, wav, flac, mp3, streamed or
    whole, SSE and realtime deltas): ``round(x * 32768)`` clipped to the int16 range, the inverse of the
    ``int16 / 32768`` every decoder (libsndfile, FFmpeg) applies, so a value on the 16-bit grid survives."""
    arr = np.asarray(audio, dtype=np.float32)
    arr = arr.T if arr.ndim == 2 and arr.shape[0] == 2 else arr.reshape(-1)  # stereo [2, S]: [S, 2], interleaved
    return np.clip(np.round(arr * np.float32(32768.0)), -32768, 32767).astype("<i2")


def pcm16(audio: Any) -> bytes:
    """float32 [-1, 1] -> little-endian signed 16-bit PCM."""
    return to_int16(audio).tobytes()


def encode_audio(audio: np.ndarray, sample_rate: int, fmt: str = "wav") -> bytes:
    fmt = fmt.lower()
    if fmt == "pcm":
        return pcm16(audio)
    if fmt not in AUDIO_FORMATS:
        raise bad_request(f"response_format: {fmt!r} is not one of wav, pcm, flac, mp3", "response_format")
    import soundfile as sf

    container, subtype = AUDIO_FORMATS[fmt]
    buf = io.BytesIO()
    # int16 in: libsndfile writes it as it is (its own float conversion floors for WAV and rounds for FLAC)
    sf.write(buf, to_int16(audio), int(sample_rate), format=container, subtype=subtype)
    return buf.getvalue()


def encode_mp4(
    frames: np.ndarray, fps: float, audio: np.ndarray | None = None, sample_rate: int | None = None
) -> bytes:
    """uint8 [T, H, W, 3] -> H.264 MP4 (odd sizes are padded by one pixel: yuv420p needs even sides), with an
    AAC track when ``audio`` (float32 [samples] or [channels, samples], in [-1, 1]) is given."""
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
        # MB-tree rate control off: with it x264 read uninitialised heap memory, so the same frames gave different
        # bitstreams from run to run (decoded pixels up to 30 levels apart; glibc's MALLOC_PERTURB_ fill byte
        # alone changed the output); every other default stays
        stream = container.add_stream(
            "libx264", rate=Fraction(fps).limit_denominator(1000), options={"x264-params": "mbtree=0"}
        )
        stream.width, stream.height, stream.pix_fmt = pw, ph, "yuv420p"
        sound = None if audio is None else _AacTrack(container, audio, sample_rate)
        for i in range(t):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frames[i]), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            sound.write()
    return buf.getvalue()


class _AacTrack:
    """An MP4's audio stream: FFmpeg's native AAC encoder, 1024-sample frames, planar float input."""

    def __init__(self, container: Any, audio: np.ndarray, sample_rate: int | None):
        arr = np.asarray(audio, dtype=np.float32)
        if arr.ndim == 1:
            arr = arr[None]
        if arr.ndim != 2 or arr.shape[0] not in (1, 2) or not sample_rate:
            raise ValueError(
                f"audio must be float32 [samples] or [1|2, samples] with a sample rate, got "
                f"{list(arr.shape)} at {sample_rate}"
            )
        self.container, self.rate = container, int(sample_rate)
        self.samples = np.ascontiguousarray(np.clip(arr, -1.0, 1.0))
        layout = "mono" if arr.shape[0] == 1 else "stereo"
        self.stream = container.add_stream("aac", rate=self.rate, layout=layout)
        # 128 kbit/s per channel: on a broadband (noise-like) 16 kHz waveform FFmpeg's AAC then keeps every sample
        # within ~0.03 of the input (RMS error ~2%); at 64 kbit/s single samples were off by up to 0.4
        self.stream.bit_rate = 128000 * arr.shape[0]

    def write(self) -> None:
        import av

        layout = "mono" if self.samples.shape[0] == 1 else "stereo"
        n = self.samples.shape[1]
        for start in range(0, n, 1024):
            frame = av.AudioFrame.from_ndarray(self.samples[:, start : start + 1024], format="fltp", layout=layout)
            frame.sample_rate, frame.pts = self.rate, start
            for packet in self.stream.encode(frame):
                self.container.mux(packet)
        for packet in self.stream.encode(None):
            self.container.mux(packet)


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
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
    )


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

        samples = np.frombuffer(data, dtype="<i2").reshape(1, -1)  # the same int16 as every other format
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
