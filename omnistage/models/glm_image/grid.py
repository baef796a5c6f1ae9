"""GLM-Image's token grids, shared by both stages and the edge between them (no heavy imports).

The AR model draws an image as a grid of VQ tokens, one per 32x32 pixels
(``GlmImageProcessor._get_target_shape``); text-to-image first draws a small
preview grid, then the target grid. The diffusion transformer takes the target
grid upsampled x2 (one prior token per 16x16 pixels = per latent patch).
"""

from __future__ import annotations

import math

from omnistage.errors import InvalidRequestError

AR_FACTOR = 32  # pixels per AR token, fixed by GlmImageProcessor


def target_grids(height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((token_h, token_w), (preview_h, preview_w)) exactly as GlmImageProcessor computes them."""
    token_h, token_w = height // AR_FACTOR, width // AR_FACTOR
    ratio = token_h / token_w
    prev_h = int(math.sqrt(ratio) * (AR_FACTOR // 2))
    prev_w = int(math.sqrt(1 / ratio) * (AR_FACTOR // 2))
    return (token_h, token_w), (prev_h, prev_w)


def check_size(height: object, width: object, where: str = "") -> tuple[int, int]:
    for name, v in (("height", height), ("width", width)):
        if not isinstance(v, int) or isinstance(v, bool) or v < AR_FACTOR or v % AR_FACTOR:
            raise InvalidRequestError(
                f"{where}{name}", f"{v!r} must be a positive multiple of {AR_FACTOR} for GLM-Image"
            )
    return int(height), int(width)


def generated_layout(height: int, width: int, image_to_image: bool) -> tuple[int, int]:
    """(offset of the target grid in the generated ids, number of ids to generate incl. the end token)."""
    (th, tw), (ph, pw) = target_grids(height, width)
    if image_to_image:  # only the target grid is drawn
        return 0, th * tw + 1
    return ph * pw, ph * pw + th * tw + 1
