"""The AR -> diffusion hand-off of GLM-Image, and where the target size comes from.

Stage 0 streams DELTA token ids; the orchestrator accumulates them, so the
edge sees the full cumulative ``token_ids`` of the finished AR request (never
a drained delta). For text-to-image they are the preview grid, then the
target grid, then the end token; for image-to-image only the target grid and
the end token. The edge cuts out the target grid for the diffusion stage.
Source-image ids (image-to-image) travel separately, under
``prior_token_image_ids`` with their ``source_image_grid_thw``, and only when
the request has source images.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from PIL import Image

from omnistage.errors import InvalidRequestError
from omnistage.models.glm_image.grid import (
    AR_FACTOR,
    check_size,
    generated_layout,
    target_grids,
)

DEFAULT_SIZE = 1024


def source_images(prompt: Mapping[str, Any]) -> list[Image.Image]:
    """The request's image-to-image source images (RGB), [] for text-to-image."""
    mm = prompt.get("multi_modal_data") or {}
    if not isinstance(mm, Mapping):
        raise InvalidRequestError("multi_modal_data", "expected an object")
    image = mm.get("image")
    if image is None:
        return []
    images = list(image) if isinstance(image, (list, tuple)) else [image]
    for i, im in enumerate(images):
        if not isinstance(im, Image.Image):
            raise InvalidRequestError(f"multi_modal_data.image[{i}]", f"expected an image, got {type(im).__name__}")
    return [im if im.mode == "RGB" else im.convert("RGB") for im in images]


def requested_size(prompt: Mapping[str, Any], params: Any) -> tuple[int, int]:
    """The target (height, width) of a request: the prompt's ``image_size`` wins, then the
    AR stage's params (``height``/``width``), then the first source image's size (cut down to
    a multiple of 32), then the default."""
    size = prompt.get("image_size")  # checked at admission: two integers (a list once it crossed processes)
    p = params if isinstance(params, Mapping) else {}
    default_h = default_w = DEFAULT_SIZE
    images = source_images(prompt)
    if images:
        w, h = images[0].size
        default_h, default_w = max(AR_FACTOR, h // AR_FACTOR * AR_FACTOR), max(AR_FACTOR, w // AR_FACTOR * AR_FACTOR)
    if size is not None:
        return check_size(size[0], size[1], "image_size.")
    return check_size(p.get("height", default_h), p.get("width", default_w), "")


def _fit(image: Image.Image, grid: list[int]) -> Image.Image:
    """The source image at its AR grid's size (h*32 x w*32): what the AR model saw is what the DiT
    conditions on. Images already that size (the usual case) pass unchanged."""
    size = (grid[2] * AR_FACTOR, grid[1] * AR_FACTOR)
    return image if image.size == size else image.resize(size, Image.Resampling.BICUBIC)


def ar_tokens_to_prior(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """Stage 0's cumulative token ids -> stage 1's inputs (prompt + prior grid [+ source images])."""
    ids = [int(t) for t in (source.get("token_ids") or [])]
    height, width = requested_size(request.prompt, request.sampling_params[0])
    i2i = source.get("prior_token_image_ids") is not None
    offset, needed = generated_layout(height, width, i2i)
    (th, tw), _ = target_grids(height, width)
    if len(ids) < offset + th * tw:
        raise ValueError(
            f"the AR stage generated {len(ids)} image tokens, {offset + th * tw} are needed for {height}x{width}"
        )
    out: dict[str, Any] = {
        "prompt": request.prompt.get("prompt", ""),
        "prior_token_ids": ids[offset : offset + th * tw],
        "prior_grid": [th, tw],
    }
    if i2i:
        grids = source["source_image_grid_thw"]
        out["prior_token_image_ids"] = source["prior_token_image_ids"]
        out["source_image_grid_thw"] = grids
        images = source_images(request.prompt)
        out["multi_modal_data"] = {"image": [_fit(im, g) for im, g in zip(images, grids)]}
    return out


def size_for_ar_stage(prompt: dict[str, Any], params: list[Any]) -> None:
    """The pipeline's request hook: the AR stage draws the image tokens on the target grid, so it must know
    the size the DiT stage will use — the DiT's height/width (from ``size``, the request, or its deploy
    defaults) go into the prompt's ``image_size`` unless the caller put a size there already. A size in the AR
    stage's own params (``height``/``width``: not vLLM sampling fields) moves to the prompt, below both."""
    dit = params[1]
    height, width = (dit.get("height"), dit.get("width")) if isinstance(dit, Mapping) else (dit.height, dit.width)
    if height is not None and width is not None:
        prompt.setdefault("image_size", (height, width))
    ar = params[0]
    if isinstance(ar, dict) and ("height" in ar or "width" in ar):
        own = {k: ar.pop(k) for k in ("height", "width") if k in ar}
        if prompt.get("image_size") is None:
            prompt["image_size"] = requested_size(prompt, own)
