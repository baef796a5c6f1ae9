"""What the ``serve`` command line controls, and the media and request limits it implies."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omnistage.limits import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_INFERENCE_STEPS,
    DEFAULT_MAX_NUM_FRAMES,
    RequestLimits,
)
from omnistage.media.limits import DEFAULT_MAX_AUDIO_S
from omnistage.server.media import MediaLimits


@dataclass
class ServeOptions:
    """What the ``serve`` command line controls (environment settings live in ServerSettings)."""

    served_model_name: str | list[str] | None = None  # several: every one is answered to, the first reported
    api_key: str | None = None
    max_pending: int | None = None  # admitted generation requests at once; more get 503
    retry_after_s: int = 2
    max_n: int = 10  # outputs per request
    max_body_bytes: int = 64 << 20
    allowed_local_media_path: str | Path | None = None
    max_media_bytes: int = 20 << 20  # one uploaded / inline media input
    max_download_bytes: int = 20 << 20  # one media input fetched from an http(s) URL
    media_fetch_timeout_s: float = 10.0  # one http(s) media download, start to end
    max_audio_s: float = DEFAULT_MAX_AUDIO_S  # one audio input, declared or decoded (media/decode.py)
    allowed_media_domains: list[str] | None = None  # hosts http(s) media may come from (None: any)
    shutdown_grace_s: float = 30.0  # in-flight requests get this long to finish on shutdown
    request_timeout_s: float | None = None  # a request (or video job) still running after this is aborted
    # per-request caps (limits.py; None: no cap)
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    max_num_frames: int | None = DEFAULT_MAX_NUM_FRAMES
    max_inference_steps: int | None = DEFAULT_MAX_INFERENCE_STEPS
    max_tokens: int | None = None
    allow_runtime_lora_updating: bool = False  # POST /v1/load_lora_adapter and /v1/unload_lora_adapter
    # /v1/realtime
    max_realtime_sessions: int | None = None  # open WebSocket sessions at once; more are refused (None: no cap)
    realtime_max_event_bytes: int = 8 << 20  # one client event (a larger frame gets an error event)
    realtime_max_buffer_s: float = 120.0  # seconds of uncommitted input audio one session may hold
    realtime_idle_timeout_s: float | None = None  # a session with no client event for this long is closed
    realtime_max_session_s: float | None = None  # a session open this long is closed
    duplex_resume_grace_s: float = 30.0  # a duplex session whose socket dropped waits this long for a resume
    # a duplex step (every live session's frame) must fit this period with a margin, or new sessions are refused
    duplex_frame_budget_ms: float = 80.0

    def media_limits(self) -> MediaLimits:
        root = Path(self.allowed_local_media_path).resolve() if self.allowed_local_media_path else None
        domains = (
            None
            if self.allowed_media_domains is None
            else frozenset(d.strip().lower() for d in self.allowed_media_domains if d.strip())
        )
        limits = MediaLimits(
            max_bytes=self.max_media_bytes,
            max_download_bytes=self.max_download_bytes,
            fetch_timeout_s=self.media_fetch_timeout_s,
            allowed_media_domains=domains,
            max_audio_s=self.max_audio_s,
            allowed_local_media_path=root,
        )
        if self.max_image_pixels is not None:  # an input image may be as large as an output one, no larger
            limits.max_image_pixels = self.max_image_pixels
        if self.max_num_frames is not None:
            limits.max_video_frames = self.max_num_frames
        return limits

    def request_limits(self) -> RequestLimits:
        return RequestLimits(
            max_image_pixels=self.max_image_pixels,
            max_num_frames=self.max_num_frames,
            max_inference_steps=self.max_inference_steps,
            max_tokens=self.max_tokens,
        )
