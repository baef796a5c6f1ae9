"""The AR -> diffusion hand-off of GLM-Image, and where the target size comes from.

Stage 0 streams DELTA token ids; the orchestrator accumulates them, so the
edge sees the full cumulative ``token_ids`` of the finished AR request (never
a drained delta). For text-to-image they are the preview grid, then the
target grid, then the end token; the edge cuts out the target grid for the
diffusion stage. Source-image ids (image-to-image) travel separately, under
``prior_token_image_ids``, and only when the request has a source image.
"""

from __future__ import annotations

from typing import Any, Mapping

from omnistage.models.glm_image.grid import check_size, generated_layout, target_grids

DEFAULT_SIZE = 1024


def requested_size(prompt: Mapping[str, Any], params: Any) -> tuple[int, int]:
    """The target (height, width) of a request: ``additional_information`` wins, then the
    AR stage's params (``height``/``width``), then the default."""
    info = prompt.get("additional_information") or {}
    if not isinstance(info, Mapping):
        raise ValueError("additional_information: expected an object")
    p = params if isinstance(params, Mapping) else {}
    h = info.get("height", p.get("height", DEFAULT_SIZE))
    w = info.get("width", p.get("width", DEFAULT_SIZE))
    where = "additional_information." if ("height" in info or "width" in info) else ""
    return check_size(h, w, where)


def ar_tokens_to_prior(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """Stage 0's cumulative token ids -> stage 1's inputs (prompt + prior grid)."""
    ids = [int(t) for t in (source.get("token_ids") or [])]
    height, width = requested_size(request.prompt, request.sampling_params[0])
    i2i = source.get("prior_token_image_ids") is not None
    offset, needed = generated_layout(height, width, i2i)
    (th, tw), _ = target_grids(height, width)
    if len(ids) < offset + th * tw:
        raise ValueError(f"the AR stage generated {len(ids)} image tokens, {offset + th * tw} are needed for "
                         f"{height}x{width} (finish_reason {source.get('finish_reason')!r})")
    out: dict[str, Any] = {"prompt": request.prompt.get("prompt", ""),
                           "prior_token_ids": ids[offset:offset + th * tw], "prior_grid": [th, tw]}
    if i2i:
        out["prior_token_image_ids"] = source["prior_token_image_ids"]
        out["source_image_grid_thw"] = source["source_image_grid_thw"]
        out["multi_modal_data"] = request.prompt.get("multi_modal_data")
    return out
