"""Bounded decoding of the media and JSON a client sends: the one place every entry point goes through
(chat parts, image edits uploads and URLs, speech ``ref_audio``, voice uploads, video ``input_reference``,
transcription files; JSON bodies and realtime events).

Each input is checked from its header before anything is decoded, then bounded again while decoding
(headers lie both ways):

- images: the declared width x height against ``max_image_pixels`` (PIL reads only the header at
  ``open``; a PNG declaring 60000x60000 pixels is refused without inflating a byte), and only the
  common raster formats are opened;
- audio: the declared duration (a WAV's RIFF sizes, read here because libsndfile and FFmpeg both clamp
  them to the file; FLAC's STREAMINFO; the container's duration) against ``max_audio_s``; a WAV whose
  data chunk declares more bytes than the file holds is truncated; while decoding, samples are counted
  and the decode stops past the limit (an "unknown length" header, a VBR stream with no index);
- video: the declared frame size, frame count and duration from the container, then decoded frames
  counted;
- every decoded input: at most ``max_decoded_bytes`` in memory (pixels, float32 samples, frames);
- base64 PCM16 (realtime ``input_audio_buffer.append`` and input_audio items): the decoded size, known from
  the base64 text's length, against a byte limit before anything is decoded;
- a declared MIME type (a ``data:`` URL's, an upload's ``Content-Type``, a fetched URL's ``Content-Type``) of
  another kind of media;
- JSON nested deeper than ``MAX_JSON_DEPTH`` (the stdlib parser would raise ``RecursionError`` on a
  100 000-deep body; anything a little shallower would still blow the stack later, in ``deepcopy``).

What fails is an ``APIError`` naming the field: 413 for pixels, frames and decoded bytes over a limit, 400
for audio longer than its limit (as a clip over a model's length always was), 415 for the wrong kind of
media, 400 for what does not decode or is truncated.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import struct
from typing import Any

import numpy as np

from omnistage.errors import APIError, bad_request
from omnistage.media.limits import MediaLimits
from omnistage.media_intake import rgb_image

MAX_JSON_DEPTH = 64
MAX_FPS = 240  # a declared frame count above max_video_s x this is a lying header
IMAGE_OPEN_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # no EPS (Ghostscript), no exotic decoders
AUDIO_BLOCK = 1 << 16  # frames read (and down-mixed) at a time


def too_big(field: str, what: str, code: str) -> APIError:
    return APIError(413, f"{field}: {what}", param=field, code=code)


# --------------------------------------------------------------------------- declared MIME types

_GENERIC = {"", "application/octet-stream", "binary/octet-stream"}
_KINDS = {"image": ("image/",), "audio": ("audio/", "video/", "application/ogg"), "video": ("video/",)}


def check_mime(mime: str | None, kind: str, field: str) -> None:
    """A declared type that is not ``kind`` (audio may come in a video container) is a 415."""
    declared = (mime or "").split(";")[0].strip().lower()
    if declared in _GENERIC or declared.startswith(_KINDS[kind]):
        return
    raise APIError(
        415, f"{field}: declared as {declared!r}, which is not {kind}", param=field, code="unsupported_media_type"
    )


# --------------------------------------------------------------------------- images


def open_image(data: bytes, field: str, limits: MediaLimits, mime: str | None = None, mode: str = "RGB") -> Any:
    """A decoded RGB ``PIL.Image`` (media_intake.rgb_image; ``mode="RGBA"``: its alpha kept); the size is checked
    from the header before any pixel is inflated."""
    from PIL import Image, UnidentifiedImageError

    check_mime(mime, "image", field)
    limit = limits.max_image_pixels
    try:
        img = Image.open(io.BytesIO(data), formats=IMAGE_OPEN_FORMATS)
        w, h = img.size
        if w * h > limit or w * h * (4 + len(mode)) > limits.max_decoded_bytes:  # RGBA while loading, then mode
            raise too_big(
                field,
                f"the image declares {w}x{h} = {w * h} pixels, above this server's limit of "
                f"{limit} (--max-image-pixels)",
                "image_too_large",
            )
        img.load()
        return rgb_image(img, mode)  # EXIF orientation, first frame, RGB: the one normal form of every image input
    except APIError:
        raise
    except Image.DecompressionBombError:  # PIL's own guard fires at open, above twice its default limit
        raise too_big(
            field,
            f"the image declares more than {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels, above this "
            f"server's limit of {limit} (--max-image-pixels)",
            "image_too_large",
        ) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
        why = "truncated" if "truncated" in str(e) else type(e).__name__
        raise bad_request(f"{field}: not a decodable image ({why})", field) from None


# --------------------------------------------------------------------------- audio


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


# --------------------------------------------------------------------------- video


def open_video(data: bytes, field: str, limits: MediaLimits, max_frames: int | None, mime: str | None = None):
    """Frames decoded from a video, checked from the container first: uint8 ``[T, H, W, 3]``, or with
    ``max_frames=None`` only the first frame decoded (a check; an llm stage samples frames itself)."""
    import av

    check_mime(mime, "video", field)
    frames: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise bad_request(f"{field}: not a decodable video (no video stream)", field)
            stream = container.streams.video[0]
            cap = _check_video_header(container, stream, field, limits, max_frames)
            for frame in container.decode(stream):
                frames.append(frame.to_ndarray(format="rgb24"))
                if max_frames is None:
                    break
                if len(frames) > cap:
                    raise too_big(
                        field,
                        f"the video decodes to more than {cap} frames (--max-num-frames, or the decoded-size limit)",
                        "video_too_large",
                    )
    except APIError:
        raise
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as e:
        raise bad_request(f"{field}: not a decodable video ({type(e).__name__})", field) from None
    if not frames:
        raise bad_request(f"{field}: video has no frames", field)
    return np.stack(frames)


def _check_video_header(container: Any, stream: Any, field: str, limits: MediaLimits, max_frames: int | None) -> int:
    """Declared size, frame count and duration against the limits; the frames the decode may produce."""
    w, h = stream.codec_context.width, stream.codec_context.height
    if w * h > limits.max_image_pixels:
        raise too_big(
            field,
            f"the video declares {w}x{h} = {w * h} pixels a frame, above this server's limit "
            f"of {limits.max_image_pixels} (--max-image-pixels)",
            "video_too_large",
        )
    seconds = (
        float(stream.duration * stream.time_base)
        if stream.duration and stream.time_base
        else (container.duration or 0) / 1e6
    )
    if seconds > limits.max_video_s:
        raise too_big(
            field,
            f"the video declares {seconds:.1f} s, above this server's limit of {limits.max_video_s:g} s",
            "video_too_large",
        )
    declared = stream.frames or 0
    by_memory = limits.max_decoded_bytes // max(1, w * h * 3)
    cap = min(max_frames, by_memory) if max_frames is not None else int(limits.max_video_s * MAX_FPS)
    if declared > cap:
        raise too_big(
            field, f"the video declares {declared} frames, above this server's limit of {cap}", "video_too_large"
        )
    return cap


# --------------------------------------------------------------------------- JSON

_SPECIAL = re.compile(rb'["\[\]{}]')
_COLON = re.compile(rb"\s*:")


def _string_end(raw: bytes, start: int) -> int:
    """The index of the quote closing the JSON string opened at ``start`` (-1: unterminated). Jumps from quote
    to quote (memchr speed over a base64 payload), skipping those escaped by an odd run of backslashes."""
    end = start + 1
    while True:
        end = raw.find(b'"', end)
        if end < 0:
            return -1
        k = end - 1
        while raw[k] == 0x5C:  # backslash
            k -= 1
        if (end - 1 - k) % 2 == 0:
            return end
        end += 1


def json_too_deep(body: bytes | str, limit: int = MAX_JSON_DEPTH) -> str | None:
    """``None`` when ``body`` nests at most ``limit`` arrays/objects deep; else the top-level key under which
    it goes deeper (``""`` when it is not under one). Scans brackets and strings, without parsing."""
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    if raw.count(b"[") + raw.count(b"{") <= limit:  # the common case, at C speed
        return None
    depth, key, top_object, pos = 0, "", False, 0
    while (m := _SPECIAL.search(raw, pos)) is not None:
        at, tok = m.start(), raw[m.start()]
        pos = at + 1
        if tok == 0x22:  # a string
            end = _string_end(raw, at)
            if end < 0:
                return None  # unterminated: the parser's error to report
            if depth == 1 and top_object and _COLON.match(raw, end + 1):
                key = raw[at + 1 : end].decode("utf-8", "replace")
            pos = end + 1
        elif tok in (0x5B, 0x7B):  # [ {
            top_object = top_object or (depth == 0 and tok == 0x7B)
            depth += 1
            if depth > limit:
                return key
        else:
            depth -= 1
    return None


def check_json_depth(body: bytes | str, limit: int = MAX_JSON_DEPTH, where: str = "request body") -> None:
    key = json_too_deep(body, limit)
    if key is not None:
        field = key or None
        raise bad_request(f"{key or where}: JSON nested more than {limit} levels deep", field, code="json_too_deep")


def loads(text: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` of a JSON string a client sent inside a form field, depth-checked first."""
    import json

    if json_too_deep(text, limit) is not None:
        raise ValueError(f"JSON nested more than {limit} levels deep")
    return json.loads(text)
