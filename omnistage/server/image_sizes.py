"""The image sizes a model can draw, for its ``/v1/models`` entry (the playground's size list).

From what the server knows without running the model: the deploy defaults' width x height (the family's native
size), else a diffusers folder's own configs (``sample_size`` x the VAE's scale factor, as diffusers' pipelines
default), and the largest side the denoiser's positional embedding covers (SD3's ``pos_embed_max_size``; past it
a request is a 400), bounded by the server's ``--max-image-pixels``. A family may declare all of it instead as
``PipelineInfo(image_size={"native": [w, h], "max_side": n, "multiple": m})``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnistage.info import PipelineInfo

CHOICES = (0.5, 1, 2, 4)  # the list offered: the native size halved, as is, doubled, quadrupled (when allowed)


def _config(folder: Path, component: str) -> dict[str, Any]:
    try:
        return json.loads((folder / component / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def folder_sizes(model: str | None) -> dict[str, Any]:
    """``native`` / ``max_side`` / ``multiple`` from a diffusers folder's configs (empty when it has none)."""
    if not model or not (Path(model) / "model_index.json").is_file():
        return {}
    folder = Path(model)
    vae = _config(folder, "vae")
    denoiser = _config(folder, "transformer") or _config(folder, "unet")
    if not vae.get("block_out_channels") or not denoiser:
        return {}
    scale = 2 ** (len(vae["block_out_channels"]) - 1)
    patch = int(denoiser.get("patch_size") or 1)
    out: dict[str, Any] = {"multiple": scale * patch}
    if isinstance(denoiser.get("sample_size"), int):
        side = denoiser["sample_size"] * scale
        out["native"] = [side, side]
    if isinstance(denoiser.get("pos_embed_max_size"), int):
        out["max_side"] = denoiser["pos_embed_max_size"] * patch * scale
    return out


def image_sizes(
    info: PipelineInfo, model: str | None, defaults: dict[str, Any], max_image_pixels: int | None
) -> dict[str, Any] | None:
    """``{"native": "WxH", "max_side": n | None, "multiple": m | None, "choices": ["WxH", ...]}``, or None when
    the native size is not known."""
    sizes = {**folder_sizes(model), **(info.image_size or {})}
    if isinstance(defaults.get("width"), int) and isinstance(defaults.get("height"), int):
        sizes["native"] = [defaults["width"], defaults["height"]]
    if not sizes.get("native"):
        return None
    (width, height), max_side, multiple = sizes["native"], sizes.get("max_side"), sizes.get("multiple")
    choices = []
    for factor in CHOICES:
        w, h = int(width * factor), int(height * factor)
        if factor != 1 and (
            min(w, h) < (multiple or 1)
            or (multiple and (w % multiple or h % multiple))
            or (max_side and max(w, h) > max_side)
            or (max_image_pixels and w * h > max_image_pixels)
        ):
            continue
        choices.append(f"{w}x{h}")
    return {"native": f"{width}x{height}", "max_side": max_side, "multiple": multiple, "choices": choices}
