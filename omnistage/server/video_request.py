"""A video request as the /v1/videos routes take it: its fields from JSON or multipart, the media it brings
decoded (a reference image, an input video, a mask), and the ``OmniRequest`` planned from them."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from omnistage.engine.request import OmniRequest
from omnistage.modality import OutputModality
from omnistage.params import DiffusionSamplingParams, denoising_stages
from omnistage.server.errors import APIError, bad_request, describe_validation
from omnistage.server.media import image_from_bytes, load_image, load_video, too_large, video_from_bytes
from omnistage.server.param_names import as_sent
from omnistage.server.protocol import VideoRequest
from omnistage.server.state import ServerState


@dataclass
class VideoInputs:
    """The media a request brought, decoded, and the fields they came in (an error names those)."""

    image: Any = None
    video: Any = None  # uint8 [T, H, W, 3]
    mask: Any = None  # uint8 [T, H, W, 3]: which pixels of the input video to regenerate (white) or keep (black)
    image_field: str = "image_reference"
    video_field: str = "video_reference"


@dataclass
class _Uploads:
    """The files a form brought: the reference image, the input video, its mask."""

    image: UploadFile | None = None
    video: UploadFile | None = None
    mask: UploadFile | None = None


async def parse_video_request(request: Request, state: ServerState) -> tuple[VideoRequest, VideoInputs]:
    """(validated fields, the decoded reference image / input video) from JSON or multipart. An uploaded
    ``input_reference`` is the reference image, or the input video when its content type is ``video/*`` (the
    OpenAI client's reference asset); ``video_reference`` is the input video as a file or a URL; ``mask``, a video
    file, masks it (a model that declares ``video_mask``)."""
    got = VideoInputs()
    fields, uploads = await _body(request, got)
    try:
        body = VideoRequest.model_validate(fields)
    except ValidationError as e:
        msg, param = describe_validation(list(e.errors()))
        raise bad_request(msg, param) from None
    if uploads.image is not None and body.image_reference is not None:
        raise bad_request("input_reference and image_reference: send one reference image, not both", "input_reference")
    if uploads.video is not None and body.video_reference is not None:
        raise bad_request(f"{got.video_field} and video_reference: send one input video, not both", got.video_field)
    if (uploads.video is not None or body.video_reference is not None) and not state.engine.pipeline.info.video_input:
        raise bad_request(f"{got.video_field}: {state.model_name} takes no input video", got.video_field)
    if uploads.mask is not None and not state.engine.pipeline.info.video_mask:
        raise bad_request(f"mask: {state.model_name} takes no mask video", "mask")
    await _decode(state, body, uploads, got)
    return body, got


async def _body(request: Request, got: VideoInputs) -> tuple[dict[str, Any], _Uploads]:
    """The request's fields and files, from a form or a JSON object (``got`` learns the fields the media came in)."""
    ctype = request.headers.get("content-type", "")
    if ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):  # (a form without files)
        form = await request.form(max_files=3, max_fields=100)
        return _form_fields(form.multi_items(), got)
    if ctype.startswith("application/json"):
        try:
            fields = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(f"request body is not valid JSON: {e}") from None
        if not isinstance(fields, dict):
            raise bad_request("request body must be a JSON object")
        if "input_reference" in fields:
            raise bad_request(
                "input_reference: must be a file upload (multipart); send URLs as image_reference", "input_reference"
            )
        return fields, _Uploads()
    raise APIError(
        415,
        "Content-Type must be multipart/form-data, application/x-www-form-urlencoded or application/json",
        code="unsupported_media_type",
    )


def _form_fields(items: list[tuple[str, Any]], got: VideoInputs) -> tuple[dict[str, Any], _Uploads]:
    """A form's plain fields, and its files sorted by what they are."""
    fields: dict[str, Any] = {}
    uploads = _Uploads()
    for key, value in items:
        if key == "input_reference":
            if not isinstance(value, UploadFile):
                raise bad_request(
                    "input_reference: expected a file upload (send URLs as image_reference)", "input_reference"
                )
            if (value.content_type or "").startswith("video/"):
                uploads.video, got.video_field = _one_video(uploads.video, value, key), key
            else:
                uploads.image, got.image_field = value, key
        elif key == "video_reference" and isinstance(value, UploadFile):
            uploads.video = _one_video(uploads.video, value, key)
        elif key == "mask":
            if not isinstance(value, UploadFile) or uploads.mask is not None:
                raise bad_request("mask: expected one file upload (a video of the input video's frames)", key)
            uploads.mask = value
        elif isinstance(value, UploadFile):
            raise bad_request(f"{key}: unexpected file upload", key)
        else:
            fields[key] = value
    return fields, uploads


async def _decode(state: ServerState, body: VideoRequest, uploads: _Uploads, got: VideoInputs) -> None:
    """The reference image, input video and mask, decoded from their files or fetched from their URLs."""
    if uploads.image is not None:
        data = await _read(uploads.image, got.image_field, state)
        got.image = await asyncio.to_thread(
            image_from_bytes, data, got.image_field, state.media, uploads.image.content_type
        )
    elif body.image_reference is not None:
        got.image = await load_image(body.reference_url(), "image_reference", state.media)
    if uploads.video is not None:
        data = await _read(uploads.video, got.video_field, state)
        got.video = await asyncio.to_thread(
            video_from_bytes, data, got.video_field, state.media, uploads.video.content_type
        )
    elif body.video_reference is not None:
        got.video = await load_video(body.video_url(), "video_reference", state.media)
    if uploads.mask is not None:
        data = await _read(uploads.mask, "mask", state)
        got.mask = await asyncio.to_thread(video_from_bytes, data, "mask", state.media, uploads.mask.content_type)


def _one_video(before: UploadFile | None, upload: UploadFile, field: str) -> UploadFile:
    if before is not None:
        raise bad_request(f"{field}: send one input video (input_reference or video_reference), not two", field)
    return upload


async def _read(upload: UploadFile, field: str, state: ServerState) -> bytes:
    data = await upload.read(state.media.max_bytes + 1)
    if len(data) > state.media.max_bytes:
        raise too_large(field, len(data), state.media.max_bytes)
    return data


def plan_video(state: ServerState, body: VideoRequest, got: VideoInputs, request_id: str) -> OmniRequest:
    lora = state.check_model(body.model)
    state.require(OutputModality.VIDEO, "video")
    knobs = body.knobs(body.extra_params, where="extra_params")
    if body.seconds is not None and knobs.num_frames is None:
        # the count is the server's: the family takes the nearest one it makes (a warning says which)
        knobs = knobs.model_copy(update={"num_frames": _frames_asked(state, body, knobs), "nearest_frames": True})
    prompt: dict[str, Any] = {"prompt": body.prompt}
    if body.negative_prompt:
        prompt["negative_prompt"] = body.negative_prompt
    mm = {"image": [got.image]} if got.image is not None else {}
    if got.video is not None:
        mm["video"] = got.video
    if got.mask is not None:
        mm["mask"] = got.mask
    if mm:
        prompt["multi_modal_data"] = mm
    # a stage that makes its video's sound too (LTX-2's video+audio) gets both into the MP4; a pipeline whose
    # audio comes from other stages (speech) does not run them for a video
    both = OutputModality.VIDEO | OutputModality.AUDIO
    made = state.engine.final_output_types()
    wanted = ["video", "audio"] if any(t & both == both for t in made) else ["video"]
    if any(OutputModality.VIDEO in t and OutputModality.ACTION in t for t in made):  # a world model's actions
        wanted.append("action")
    return state.make_request(prompt, request_id, output_modalities=wanted, knobs=knobs, lora=lora)


def _frames_asked(state: ServerState, body: VideoRequest, knobs: Any) -> int:
    targets = denoising_stages(state.engine.pipeline)
    default_fps = state.engine.default_sampling_params_list[targets[0]].get("fps") if targets else None
    return max(1, round(body.seconds * (knobs.fps or default_fps or 16)))


def video_warnings(state: ServerState, body: VideoRequest, req: OmniRequest, video: Any) -> list[str]:
    """The request's warnings, and the frame count when the family made another than seconds x fps."""
    out = list(req.warnings)
    targets = denoising_stages(state.engine.pipeline)
    params = req.sampling_params[targets[0]] if targets else None
    if not isinstance(params, DiffusionSamplingParams):  # the route builds these for every denoising stage
        return out
    asked = params.num_frames
    if params.nearest_frames and video is not None and asked and len(video) != asked:
        out.append(
            f"seconds={body.seconds:g} x fps={params.fps or '?'} is {asked} frames, a count "
            f"{state.engine.pipeline.name} does not make; it made the nearest, {len(video)}"
        )
    return out


def video_error_as_sent(err: APIError, body: VideoRequest, got: VideoInputs) -> APIError:
    """The error in the caller's words (param_names.py): ``seconds``, ``size``, the reference image's and the
    input video's fields."""
    sent = body.model_fields_set | set(body.extra_params or {})
    return as_sent(err, sent, got.image_field, got.video_field)
