"""A deliberately simple judge of the demo's pictures: colour and horizontal position
of the largest region that differs from the background."""

from __future__ import annotations

from collections import deque

import numpy as np

# What the colour words mean (the demo's training palette, restated here so a change
# to the training data cannot silently change the judge).
PALETTE = {
    "red": (220, 30, 30),
    "orange": (245, 135, 20),
    "yellow": (240, 220, 30),
    "green": (40, 170, 60),
    "cyan": (30, 200, 220),
    "blue": (40, 70, 220),
    "purple": (140, 50, 190),
    "pink": (245, 120, 190),
}
MIN_REGION = 12  # pixels; anything smaller is noise, not a shape


def _largest_region(mask: np.ndarray) -> np.ndarray | None:
    """Largest 4-connected component of ``mask`` (flood fill; images are tiny)."""
    h, w = mask.shape
    seen = np.zeros_like(mask, dtype=bool)
    best: list[tuple[int, int]] = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        region, queue = [], deque([(y0, x0)])
        seen[y0, x0] = True
        while queue:
            y, x = queue.popleft()
            region.append((y, x))
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        if len(region) > len(best):
            best = region
    if len(best) < MIN_REGION:
        return None
    out = np.zeros_like(mask, dtype=bool)
    ys, xs = zip(*best)
    out[list(ys), list(xs)] = True
    return out


def analyse(image: np.ndarray, threshold: float = 60.0) -> dict:
    """-> {"colour": name | None, "position": "left" | "center" | "right" | None, "area": int}."""
    img = np.asarray(image, dtype=np.float32)[..., :3]
    h, w, _ = img.shape
    border = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
    background = np.median(border, axis=0)
    distance = np.linalg.norm(img - background, axis=-1)
    region = _largest_region(distance > threshold)
    if region is None:
        return {"colour": None, "position": None, "area": 0}
    colour = np.median(img[region], axis=0)
    names = list(PALETTE)
    refs = np.array([PALETTE[n] for n in names], dtype=np.float32)
    name = names[int(np.argmin(np.linalg.norm(refs - colour, axis=-1)))]
    cx = float(np.nonzero(region)[1].mean()) / w
    position = "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "center"
    return {"colour": name, "position": position, "area": int(region.sum())}
