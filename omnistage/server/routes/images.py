"""POST /v1/images/generations and /v1/images/edits (multipart uploads or image_url)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from omnistage.errors import InvalidRequestError
from omnistage.modality import OutputModality
from omnistage.server.deps import get_state
from omnistage.server.errors import (
    APIError,
    bad_request,
    describe_validation,
    error_responses,
    from_engine_error,
)
from omnistage.server.media import (
    b64,
    encode_image,
    image_from_bytes,
    load_image,
    too_large,
)
from omnistage.server.middleware import request_id
from omnistage.server.openapi import request_body
from omnistage.server.param_names import as_sent
from omnistage.server.prompt_warnings import drawn_size, prompt_warnings, warning_headers
from omnistage.server.protocol import ImageRequest
from omnistage.server.state import ServerState

router = APIRouter(prefix="/v1")
MAX_INPUT_IMAGES = 16


@router.post("/images/generations")
async def generations(
    body: ImageRequest, request: Request, response: Response, state: ServerState = Depends(get_state)
) -> dict:
    if body.image_url is not None:
        raise bad_request("image_url: only accepted by /v1/images/edits", "image_url")
    return await generate_images(state, request, body, [], response)


@router.post(
    "/images/edits", responses=error_responses(413, 415), openapi_extra=request_body(ImageRequest, {"image": True})
)
async def edits(request: Request, response: Response, state: ServerState = Depends(get_state)) -> dict:
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        body, images = await _from_multipart(request, state)
    elif ctype.startswith("application/json"):
        try:
            raw = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(f"request body is not valid JSON: {e}") from None
        body, images = _validate(raw), []
    else:
        raise APIError(
            415, "Content-Type must be multipart/form-data or application/json", code="unsupported_media_type"
        )
    urls = [body.image_url] if isinstance(body.image_url, str) else list(body.image_url or [])
    if len(images) + len(urls) > MAX_INPUT_IMAGES:
        raise bad_request(f"image: at most {MAX_INPUT_IMAGES} input images", "image")
    for i, url in enumerate(urls):
        field = f"image_url[{i}]" if len(urls) > 1 else "image_url"
        images.append(await load_image(url, field, state.media, state.image_mode()))
    if not images:
        raise bad_request(
            "image: at least one input image is required (upload 'image' files or send 'image_url')", "image"
        )
    return await generate_images(state, request, body, images, response, "image_url" if urls else "image")


def _validate(raw: Any) -> ImageRequest:
    if not isinstance(raw, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return ImageRequest.model_validate(raw)
    except ValidationError as e:
        msg, param = describe_validation(list(e.errors()))
        raise bad_request(msg, param) from None


async def _from_multipart(request: Request, state: ServerState) -> tuple[ImageRequest, list[Any]]:
    form = await request.form(max_files=MAX_INPUT_IMAGES + 1, max_fields=200)
    fields: dict[str, Any] = {}
    images = []
    for key, value in form.multi_items():
        if key in ("image", "image[]"):
            if not isinstance(value, UploadFile):
                raise bad_request(f"{key}: expected a file upload (send URLs as 'image_url')", "image")
            data = await value.read(state.media.max_bytes + 1)
            if len(data) > state.media.max_bytes:
                raise too_large("image", len(data), state.media.max_bytes)
            mode, mime = state.image_mode(), value.content_type
            images.append(await asyncio.to_thread(image_from_bytes, data, "image", state.media, mime, mode))
        elif key == "mask":
            raise bad_request("mask: masked edits are not supported; send the image only", "mask")
        elif isinstance(value, UploadFile):
            raise bad_request(f"{key}: unexpected file upload", key)
        elif key in ("image_url", "image_url[]"):
            fields.setdefault("image_url", []).append(value)
        else:
            fields[key] = value
    return _validate(fields), images


async def generate_images(
    state: ServerState,
    request: Request,
    body: ImageRequest,
    images: list[Any],
    response: Response,
    image_field: str = "image",
) -> dict:
    lora = state.check_model(body.model)
    state.require(OutputModality.IMAGE, "images")
    if body.response_format != "b64_json":
        raise bad_request("response_format: only 'b64_json' is supported (no URLs are hosted)", "response_format")
    if body.stream:
        raise bad_request("stream: streaming image generation is not supported", "stream")
    knobs = body.knobs(body.extra_body)
    state.check_n(knobs.n)
    if len(images) > 1 and state.engine.pipeline.info.image_batch:
        knobs = _per_image(knobs, len(images))
    prompt: dict[str, Any] = {"prompt": body.prompt}
    if knobs.negative_prompt:
        prompt["negative_prompt"] = knobs.negative_prompt
    if images:
        prompt["multi_modal_data"] = {"image": images}
    try:
        req = state.make_request(prompt, request_id(request.scope), output_modalities=["image"], knobs=knobs, lora=lora)
        result = await state.run(request, req)
    except (APIError, InvalidRequestError) as e:  # named as the caller sent it (size, image, image_url)
        raise as_sent(from_engine_error(e), body.model_fields_set | set(body.extra_body or {}), image_field) from None
    quality = body.output_compression
    encoded = await asyncio.to_thread(lambda: [encode_image(im, body.output_format, quality) for im in result.images])
    revised = {"revised_prompt": result.revised_prompt} if result.revised_prompt is not None else {}
    out: dict[str, Any] = {
        "created": int(time.time()),
        "data": [{"b64_json": b64(e), **revised} for e in encoded],
        "output_format": body.output_format,
    }
    if result.images:
        out["size"] = "{}x{}".format(*result.images[0].size)
    if body.return_stage_metrics:
        out["stage_metrics"] = {str(k): v for k, v in result.metrics.items()}
    info = state.engine.pipeline.info
    warnings = req.warnings + prompt_warnings(info, state.model_name, body.prompt, drawn_size(req.sampling_params))
    if warnings:  # words the model cannot draw (docs/server.md): said, not silently ignored
        out["warnings"] = warnings
        for name, value in warning_headers(warnings):
            response.headers.append(name, value)
    return out


def _per_image(knobs: Any, images: int) -> Any:
    """A family that edits each input image on its own (diffusers' image batch: outputs = images x per
    prompt): ``n`` counts the images returned, as OpenAI's does, so it must be a multiple of the inputs."""
    if knobs.n is None:
        return knobs  # one edit of each input image
    if knobs.n % images:
        raise bad_request(
            f"n: this model edits each input image on its own, so n={knobs.n} images cannot come from {images} "
            f"inputs; send n as a multiple of {images} (n per input: n / {images}) or one image per request",
            "n",
        )
    return knobs.model_copy(update={"n": knobs.n // images, "num_outputs_per_prompt": None})
