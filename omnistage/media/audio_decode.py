"""Bounded decoding of the audio a client sends (speech ``ref_audio``, voice uploads, transcription files,
realtime PCM16): the declared duration is checked from the header, then decoded frames are counted
against the duration and decoded-size limits (media/decode.py has the rules every input follows)."""

from __future__ import annotations

import base64
import binascii
import io
import struct

import numpy as np

from omnistage.errors import APIError, bad_request
from omnistage.media.decode import check_mime, too_big
from omnistage.media.limits import MediaLimits

AUDIO_BLOCK = 1 << 16  # frames read (and down-mixed) at a time


def _riff_wav(data: bytes) -> tuple[int, int, int | None, int] | None:
    """(sample rate, bytes per frame, declared data bytes or None when unknown, data bytes present) of a
    RIFF WAVE file, from its own chunk headers; None if it is not one."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    rate = block = 0
    off = 12
    while off + 8 <= len(data):
        cid, size = data[off : off + 4], struct.unpack("<I", data[off + 4 : off + 8])[0]
        if cid == b"fmt " and size >= 16 and off + 24 <= len(data):
            _, _, rate, _, block = struct.unpack("<HHIIH", data[off + 8 : off + 22])
        elif cid == b"data":
            present = len(data) - off - 8
            return rate, block, None if size in (0, 0xFFFFFFFF) else size, present  # streamed WAVs say "unknown"
        off += 8 + size + (size & 1)
    return None


def _declared_seconds(data: bytes) -> tuple[float | None, float | None]:
    """The duration the audio's header declares (None: it does not say), and for a WAV the seconds its
    file holds."""
    wav = _riff_wav(data)
    if wav is not None:
        rate, block, declared, present = wav
        if declared is None or rate <= 0 or block <= 0:
            return None, None  # the decoder says what is wrong
        return declared / (rate * block), present / (rate * block)
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
        return (info.frames / info.samplerate if info.frames > 0 and info.samplerate > 0 else None), None
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError):
        pass
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.audio[0] if container.streams.audio else None
            if stream is not None and stream.duration and stream.time_base:
                return float(stream.duration * stream.time_base), None
            return (container.duration / 1e6 if container.duration else None), None
    except (av.error.FFmpegError, ValueError, IndexError, OSError):
        return None, None  # the decoder says why


class AudioBudget:
    """Counts decoded frames of one input against its limits (both duration and memory)."""

    def __init__(self, field: str, limits: MediaLimits, max_s: float | None, data: bytes):
        self.field = field
        own = max_s is not None and max_s < limits.max_audio_s  # the route's (the model's) limit binds
        self.max_s = max_s if own else limits.max_audio_s
        self.whose = "the model's limit" if own else "this server's limit, --max-audio-seconds"
        self.max_samples = limits.max_decoded_bytes // 4  # float32 mono
        self.frames = 0
        declared, present = _declared_seconds(data)
        if declared is not None and declared > self.max_s:
            raise self._too_long(f"the audio declares {declared:.1f} s")
        if declared is not None and present is not None and declared > present + 0.01:
            raise bad_request(
                f"{field}: truncated: the WAV header declares {declared:.2f} s, the file holds {present:.2f} s",
                field,
                code="truncated_media",
            )

    def _too_long(self, what: str) -> APIError:
        # a 400 (as a clip over a model's length always was), not a 413: the bytes may be few
        return bad_request(
            f"{self.field}: {what}, longer than {self.max_s:g} s ({self.whose})", self.field, code="audio_too_long"
        )

    def add(self, frames: int, rate: int) -> None:
        self.frames += frames
        if self.frames > self.max_s * rate:
            raise self._too_long(f"the audio decodes to more than {self.max_s:g} s")
        if self.frames > self.max_samples:
            raise too_big(
                self.field,
                f"the audio decodes to more than {self.max_samples} samples, above this "
                f"server's limit of {self.max_samples * 4} decoded bytes",
                "audio_too_large",
            )


def read_audio(
    data: bytes, field: str, limits: MediaLimits, max_s: float | None = None, mime: str | None = None
) -> tuple[np.ndarray, int]:
    """Float32 mono samples (channels averaged) and the native rate, decoded by soundfile in bounded blocks."""
    import soundfile as sf

    check_mime(mime, "audio", field)
    budget = AudioBudget(field, limits, max_s, data)
    pieces: list[np.ndarray] = []
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate = int(f.samplerate)
            while True:
                block = f.read(AUDIO_BLOCK, dtype="float32", always_2d=True)
                if not len(block):
                    break
                budget.add(len(block), rate)
                pieces.append(block.mean(axis=1, dtype=np.float32))
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        raise bad_request(f"{field}: not decodable audio ({type(e).__name__})", field) from None
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    return samples.astype(np.float32, copy=False), rate


def decode_audio_av(
    data: bytes, field: str, limits: MediaLimits, max_s: float | None = None, mime: str | None = None
) -> tuple[np.ndarray, int]:
    """The same through PyAV (any container and codec FFmpeg opens): float32 mono at the native rate."""
    import av

    check_mime(mime, "audio", field)
    budget = AudioBudget(field, limits, max_s, data)
    pieces: list[np.ndarray] = []
    native = 0
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise bad_request(f"{field}: not a decodable audio file (no audio stream)", field)
            # planar float, channels kept: averaged here rather than by FFmpeg's mixing matrix
            resampler = av.AudioResampler(format="fltp")
            for frame in container.decode(container.streams.audio[0]):
                for out in resampler.resample(frame):
                    native = out.sample_rate
                    budget.add(out.samples, native)
                    pieces.append(out.to_ndarray().mean(axis=0))
    except APIError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as e:
        raise bad_request(f"{field}: not a decodable audio file ({type(e).__name__})", field) from None
    if not pieces:
        raise bad_request(f"{field}: the audio has no samples", field)
    return np.concatenate(pieces).astype(np.float32), native


# --------------------------------------------------------------------------- base64 PCM16


def base64_size(data: str) -> int:
    """The bytes base64 ``data`` decodes to, from its length alone (exact when it is valid base64)."""
    return len(data) // 4 * 3 - data[-2:].count("=") + max(0, len(data) % 4 - 1)


def decode_pcm16(data: str, field: str, max_bytes: int) -> bytes:
    """Raw 16-bit PCM from strict base64 (no stray characters), a whole number of samples; more than
    ``max_bytes`` is refused from the text's length, before a byte is decoded."""
    size = base64_size(data)
    if size > max_bytes:
        raise too_big(field, f"{size} bytes of audio exceeds the limit of {max_bytes} bytes", "payload_too_large")
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{field}: not valid base64", field, code="invalid_value") from None
    if len(pcm) % 2:
        raise bad_request(
            f"{field}: {len(pcm)} bytes is not a whole number of 16-bit samples", field, code="invalid_value"
        )
    return pcm
