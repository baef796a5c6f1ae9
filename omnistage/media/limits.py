"""The bounds on one media input, shared by every decoder and fetcher."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_AUDIO_S = 3600.0


@dataclass
class MediaLimits:
    """The bounds on one media input (media/decode.py checks the decoding ones)."""

    max_bytes: int = 20 << 20  # one uploaded or inline input (multipart file, data: URL, base64, file://)
    max_image_pixels: int = 4096 * 4096  # one image or video frame, as declared
    max_video_frames: int = 256  # frames of one video decoded by the server (non-llm stages)
    max_video_s: float = 600.0  # one video's declared duration
    max_audio_s: float = DEFAULT_MAX_AUDIO_S  # one audio input's duration, declared or decoded (a route may ask less)
    max_decoded_bytes: int = 1 << 30  # one decoded input in memory (pixels, float32 samples, frames)
    fetch_timeout_s: float = 10.0  # one http(s) download, start to end
    max_download_bytes: int = 20 << 20  # one http(s) download
    allowed_media_domains: frozenset[str] | None = None  # http(s) hosts media may come from (None: any)
    allowed_local_media_path: Path | None = None
