"""Request and response bodies of the HTTP API (pydantic).

Validation here is the first line of defence: every field a client sends is
typed, so wrong types and out-of-range values answer 400 naming the field
before anything reaches an engine.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


def parse_size(size: str | None) -> tuple[int, int] | None:
    """``"WxH"`` -> (width, height); ``None`` / ``"auto"`` -> None."""
    if size is None or size == "auto":
        return None
    m = _SIZE.match(size)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"expected 'WIDTHxHEIGHT' (e.g. '512x512') or 'auto', got {size!r}")
    return int(m.group(1)), int(m.group(2))


class GenerationKnobs(BaseModel):
    """Standard generation keys (SPEC §5), accepted top-level or in ``extra_body``.

    Anything else in ``extra_body`` is model-specific and goes to ``extra_args``.
    """

    model_config = ConfigDict(extra="allow")

    # diffusion
    height: int | None = Field(None, ge=1, le=16384)
    width: int | None = Field(None, ge=1, le=16384)
    size: str | None = None
    num_inference_steps: int | None = Field(None, ge=1, le=1000)
    guidance_scale: float | None = Field(None, ge=0)
    guidance_scale_2: float | None = Field(None, ge=0)
    true_cfg_scale: float | None = Field(None, ge=0)
    negative_prompt: str | None = None
    seed: int | None = None
    n: int | None = Field(None, ge=1)
    strength: float | None = Field(None, gt=0, le=1)
    num_frames: int | None = Field(None, ge=1, le=10000)
    fps: int | None = Field(None, ge=1, le=240)
    # llm (vLLM SamplingParams)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    min_tokens: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool | None = None

    @field_validator("size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        parse_size(v)
        return v

    def knobs(self) -> dict[str, Any]:
        """The standard keys that were set."""
        return {k: getattr(self, k) for k in GenerationKnobs.model_fields if k in self.model_fields_set and getattr(self, k) is not None}

    def extras(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# --------------------------------------------------------------------------- chat


class URLRef(BaseModel):
    model_config = ConfigDict(extra="allow")
    url: str


class InputAudio(BaseModel):
    data: str
    format: str = "wav"


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "image_url", "audio_url", "video_url", "input_audio", "input_text"]
    text: str | None = None
    image_url: URLRef | str | None = None
    audio_url: URLRef | str | None = None
    video_url: URLRef | str | None = None
    input_audio: InputAudio | None = None

    @model_validator(mode="after")
    def _payload(self) -> "ContentPart":
        key = "text" if self.type == "input_text" else self.type
        if getattr(self, key) is None:
            raise ValueError(f"a content part of type {self.type!r} needs a {key!r} field")
        return self

    def url(self) -> str | None:
        ref = getattr(self, self.type, None)
        return ref.url if isinstance(ref, URLRef) else ref


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ChatCompletionRequest(GenerationKnobs):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    sampling_params_list: list[dict[str, Any] | None] | None = None
    extra_body: dict[str, Any] | None = None
    return_stage_metrics: bool = False
    mm_processor_kwargs: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    logprobs: bool | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None


# --------------------------------------------------------------------------- images

_OPENAI_IGNORED = ("quality", "style", "background", "moderation", "user", "partial_images", "input_fidelity")


class ImageRequest(GenerationKnobs):
    model: str | None = None
    prompt: str = Field(min_length=1, max_length=32000)
    response_format: Literal["b64_json", "url"] = "b64_json"
    output_format: Literal["png", "jpeg", "webp"] = "png"
    output_compression: int | None = Field(None, ge=0, le=100)
    stream: bool = False
    extra_body: dict[str, Any] | None = None
    return_stage_metrics: bool = False
    image_url: str | list[str] | None = None  # edits: images by URL instead of upload

    def extras(self) -> dict[str, Any]:
        return {k: v for k, v in (self.model_extra or {}).items() if k not in _OPENAI_IGNORED}


# --------------------------------------------------------------------------- audio


class SpeechRequest(GenerationKnobs):
    model: str | None = None
    input: str = Field(min_length=1, max_length=8192)
    voice: str | None = None
    response_format: Literal["wav", "pcm", "flac", "mp3"] = "wav"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    stream: bool = False
    stream_format: Literal["audio", "sse"] = "audio"
    extra_body: dict[str, Any] | None = None


# --------------------------------------------------------------------------- videos


class VideoRequest(BaseModel):
    """Fields of POST /v1/videos (JSON or multipart; the file part is handled by the route)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str = Field(min_length=1, max_length=32000)
    negative_prompt: str | None = None
    image_reference: str | URLRef | None = None
    size: str | None = None
    width: int | None = Field(None, ge=1, le=16384)
    height: int | None = Field(None, ge=1, le=16384)
    seconds: float | None = Field(None, gt=0, le=600)
    num_frames: int | None = Field(None, ge=1, le=10000)
    fps: int | None = Field(None, ge=1, le=240)
    num_inference_steps: int | None = Field(None, ge=1, le=1000)
    guidance_scale: float | None = Field(None, ge=0)
    guidance_scale_2: float | None = Field(None, ge=0)
    true_cfg_scale: float | None = Field(None, ge=0)
    seed: int | None = None
    extra_params: dict[str, Any] | None = None

    @field_validator("size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        parse_size(v)
        return v

    @field_validator("extra_params", mode="before")
    @classmethod
    def _json(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = json.loads(v) if v.strip() else None
            except json.JSONDecodeError as e:
                raise ValueError(f"not valid JSON: {e.msg}") from None
        return v

    def reference_url(self) -> str | None:
        ref = self.image_reference
        return ref.url if isinstance(ref, URLRef) else ref


class VideoJob(BaseModel):
    id: str
    object: Literal["video"] = "video"
    model: str
    prompt: str
    status: Literal["queued", "in_progress", "completed", "failed"] = "queued"
    progress: int = 0
    created_at: int = Field(default_factory=lambda: int(time.time()))
    completed_at: int | None = None
    expires_at: int | None = None
    size: str | None = None
    seconds: str | None = None
    error: dict[str, Any] | None = None
    inference_time_s: float | None = None
