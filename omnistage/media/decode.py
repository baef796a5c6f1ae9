"""Bounded decoding of the media and JSON a client sends: the one place every entry point goes through
(chat parts, image edits uploads and URLs, speech ``ref_audio``, voice uploads, video ``input_reference``,
transcription files; JSON bodies and realtime events). Images and video are decoded here, audio in
audio_decode.py, JSON's depth checked in json_depth.py; the rules are the same for all.

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

import io
from typing import Any

import numpy as np

from omnistage.errors import APIError, bad_request
from omnistage.media.limits import MediaLimits
from omnistage.media_intake import rgb_image

MAX_FPS = 240  # a declared frame count above max_video_s x this is a lying header
IMAGE_OPEN_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # no EPS (Ghostscript), no exotic decoders


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
