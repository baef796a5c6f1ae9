"""Request and response bodies of the HTTP API (pydantic).

Validation here is the first line of defence: every field a client sends is
typed, so wrong types and out-of-range values answer 400 naming the field
before anything reaches an engine. The generation knobs every route shares are
one table, ``omnistage.params.RequestKnobs``, which the bodies extend.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, field_validator

from omnistage.media.json_depth import loads
from omnistage.params import RequestKnobs

# --------------------------------------------------------------------------- chat


class URLRef(BaseModel):
    model_config = ConfigDict(extra="allow")
    url: str


class InputAudio(BaseModel):
    data: str
    format: str = "wav"


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @property
    def payload(self) -> str:
        """The field that holds the part's data, as the caller named it (errors name it)."""
        return self.type

    def url(self) -> str | None:
        ref = getattr(self, self.payload, None)
        return ref.url if isinstance(ref, URLRef) else ref


# One model per content-part type, told apart by ``type`` (a discriminated union): the OpenAPI document
# then says which payload field each type needs, so a schema-driven client (or fuzzer) can build valid parts.
class TextPart(_Part):
    type: Literal["text", "input_text"]
    text: str


class ImageURLPart(_Part):
    type: Literal["image_url"]
    image_url: URLRef | str


class AudioURLPart(_Part):
    type: Literal["audio_url"]
    audio_url: URLRef | str


class VideoURLPart(_Part):
    type: Literal["video_url"]
    video_url: URLRef | str


class InputAudioPart(_Part):
    type: Literal["input_audio"]
    input_audio: InputAudio


class _ShortMediaPart(_Part):
    """vLLM-Omni's short form of a media part, with no ``type``: ``{"image": "<base64 or URL>"}`` (and the same for
    ``audio`` and ``video``). It is the ``*_url`` part of its kind; bare base64 is the file's bytes."""

    KIND: ClassVar[str]

    @property
    def type(self) -> str:
        return f"{self.KIND}_url"

    @property
    def payload(self) -> str:
        return self.KIND

    def url(self) -> str:
        value: str = getattr(self, self.KIND)
        scheme = value.split(":", 1)[0].lower() if ":" in value[:16] else ""
        # base64 has no ":", so anything with a URL scheme is a URL (fetched, or refused naming the field)
        return value if scheme else f"data:application/octet-stream;base64,{value}"


class ImagePart(_ShortMediaPart):
    KIND: ClassVar[str] = "image"
    image: str = Field(min_length=1)


class AudioPart(_ShortMediaPart):
    KIND: ClassVar[str] = "audio"
    audio: str = Field(min_length=1)


class VideoPart(_ShortMediaPart):
    KIND: ClassVar[str] = "video"
    video: str = Field(min_length=1)


_PART_MODELS = {
    "text": "TextPart",
    "input_text": "TextPart",
    "image_url": "ImageURLPart",
    "audio_url": "AudioURLPart",
    "video_url": "VideoURLPart",
    "input_audio": "InputAudioPart",
}
# A part without ``type`` (vLLM's and vLLM-Omni's short forms) is the one its payload key names
_SHORT_MODELS = {
    **{k: v for k, v in _PART_MODELS.items() if k != "input_text"},
    "image": "ImagePart",
    "audio": "AudioPart",
    "video": "VideoPart",
}


def _part_model(value: Any) -> str | None:
    if isinstance(value, dict) and "type" not in value:
        named = [_SHORT_MODELS[k] for k in value if k in _SHORT_MODELS]
        return named[0] if len(named) == 1 else None
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if isinstance(value, _ShortMediaPart):
        return type(value).__name__
    return _PART_MODELS.get(kind) if isinstance(kind, str) else None


def _typed(value: Any) -> Any:
    """vLLM's short form ``{"text": ...}`` / ``{"image_url": ...}`` gets the ``type`` its key names."""
    if isinstance(value, dict) and "type" not in value:
        kinds = [k for k in value if k in _PART_MODELS and k != "input_text"]
        if len(kinds) == 1:
            return {"type": kinds[0], **value}
    return value


# Tagged by model name (not the ``type`` value), so error locations read ``content[0].image_url``
ContentPart = Annotated[
    Annotated[TextPart, Tag("TextPart")]
    | Annotated[ImageURLPart, Tag("ImageURLPart")]
    | Annotated[AudioURLPart, Tag("AudioURLPart")]
    | Annotated[VideoURLPart, Tag("VideoURLPart")]
    | Annotated[InputAudioPart, Tag("InputAudioPart")]
    | Annotated[ImagePart, Tag("ImagePart")]
    | Annotated[AudioPart, Tag("AudioPart")]
    | Annotated[VideoPart, Tag("VideoPart")],
    Discriminator(
        _part_model,
        custom_error_type="content_part_type",
        custom_error_message=(
            f"type must be one of {', '.join(_PART_MODELS)} (or, without type, one of the keys "
            f"{', '.join(_SHORT_MODELS)})"
        ),
    ),
    BeforeValidator(_typed),
]


class Message(BaseModel):
    """A system, developer, user or tool message: content required."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "tool"]
    content: str | list[ContentPart]
    name: str | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _role(cls, v: Any) -> Any:
        if v not in _ROLES:  # (an unknown role lands here: say every role there is)
            raise ValueError(f"must be one of {', '.join(_ROLES)}")
        return v


class AssistantMessage(BaseModel):
    """An assistant turn: content may be null (OpenAI allows it beside tool calls)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["assistant"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


_ROLES = ("system", "developer", "user", "assistant", "tool")


def _message_model(value: Any) -> str:
    role = value.get("role") if isinstance(value, dict) else getattr(value, "role", None)
    return "AssistantMessage" if role == "assistant" else "Message"


ChatMessage = Annotated[
    Annotated[Message, Tag("Message")] | Annotated[AssistantMessage, Tag("AssistantMessage")],
    Discriminator(_message_model),
]


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


# Request examples in the OpenAPI document (/docs offers them; schema-driven clients start from them), sized for
# the built-in demo model (64x64 images) and small enough for any server's default caps.
class ChatAudio(BaseModel):
    """OpenAI's chat ``audio`` parameter: the voice (and format) of audio output."""

    model_config = ConfigDict(extra="forbid")

    voice: str | None = None
    format: Literal["wav", "pcm16"] = "wav"


class ChatCompletionRequest(RequestKnobs):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"messages": [{"role": "user", "content": "A red circle on a white background."}], "max_tokens": 8},
                {
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
                    "max_tokens": 8,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            ]
        }
    )

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[str] | None = None
    audio: ChatAudio | None = None
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
    # OpenAI's cache-routing key: the requests naming one (a conversation's turns) go to the same replica
    prompt_cache_key: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None


# --------------------------------------------------------------------------- images


class ImageRequest(RequestKnobs):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"prompt": "a red circle on a white background", "size": "64x64", "num_inference_steps": 2, "seed": 7}
            ]
        }
    )

    model: str | None = None
    prompt: str = Field(min_length=1, max_length=32000)
    response_format: Literal["b64_json", "url"] = "b64_json"
    output_format: Literal["png", "jpeg", "webp"] = "png"
    output_compression: int | None = Field(None, ge=0, le=100)
    stream: bool = False
    extra_body: dict[str, Any] | None = None
    return_stage_metrics: bool = False
    image_url: str | list[str] | None = None  # edits: images by URL instead of upload

    # OpenAI image fields with no meaning here: accepted, never taken for model-specific keys
    IGNORED: ClassVar[frozenset[str]] = frozenset(
        {"quality", "style", "background", "moderation", "user", "partial_images", "input_fidelity"}
    )


# --------------------------------------------------------------------------- audio


class SpeechRequest(RequestKnobs):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"input": "Hello there.", "response_format": "wav"},
                {"input": "Hello there.", "response_format": "pcm", "stream": True},
            ]
        }
    )

    model: str | None = None
    input: str = Field(min_length=1, max_length=8192)
    voice: str | None = None
    response_format: Literal["wav", "pcm", "flac", "mp3"] = "wav"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    stream: bool = False
    stream_format: Literal["audio", "sse"] = "audio"
    extra_body: dict[str, Any] | None = None
    return_stage_metrics: bool = False  # X-Stage-Metrics header (JSON), or in the SSE done event
    # voice cloning: a reference clip (http(s)/data:/file:// URL or bare base64 of an audio file) + its transcript
    ref_audio: str | None = Field(None, min_length=1)
    ref_text: str | None = Field(None, max_length=8192)
    x_vector_only_mode: bool | None = None  # clone from the clip's speaker embedding alone (no ref_text)
    enable_text_splitting: bool | None = None  # speak the text sentence by sentence (SpeechInfo.splits_text)
    language: str | None = Field(None, max_length=64)
    max_new_tokens: int | None = Field(None, ge=1)  # the speech LM's max_tokens
    # per-stage params, as on /v1/chat/completions (e.g. Qwen3-Omni's talker budget in entry 1)
    sampling_params_list: list[dict[str, Any] | None] | None = None
    initial_codec_chunk_frames: int | None = Field(None, ge=1)  # streamed: codec frames in the first audio chunk


# --------------------------------------------------------------------------- videos


class VideoRequest(RequestKnobs):
    """Fields of POST /v1/videos (JSON or multipart; the file part is handled by the route).
    Model-specific keys travel in ``extra_params``, so unknown top-level fields are errors."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "prompt": "a paper boat on a pond",
                    "size": "64x64",
                    "num_frames": 9,
                    "num_inference_steps": 2,
                    "seed": 7,
                }
            ]
        },
    )

    model: str | None = None
    prompt: str = Field(min_length=1, max_length=32000)
    image_reference: str | URLRef | None = None
    video_reference: str | URLRef | None = None  # an input video (URL, data: URL or {"url"}): video-to-video
    seconds: float | None = Field(None, gt=0, le=600)
    extra_params: dict[str, Any] | None = None
    return_stage_metrics: bool = False  # the job's stage_metrics once completed; X-Stage-Metrics on /sync

    @field_validator("extra_params", mode="before")
    @classmethod
    def _json(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = loads(v) if v.strip() else None  # depth-checked: a form field is a JSON body too
            except json.JSONDecodeError as e:
                raise ValueError(f"not valid JSON: {e.msg}") from None
        return v

    def reference_url(self) -> str | None:
        ref = self.image_reference
        return ref.url if isinstance(ref, URLRef) else ref

    def video_url(self) -> str | None:
        ref = self.video_reference
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
    stage_metrics: dict[str, Any] | None = None  # when the request asked return_stage_metrics
    warnings: list[str] | None = None  # what the request asked that was ignored or adjusted (e.g. the frame count)
    # a world model's action chunk beside the video: one list of floats per step, its embodiment, steps per second
    actions: list[list[float]] | None = None
    action_domain: str | None = None
    action_fps: float | None = None
