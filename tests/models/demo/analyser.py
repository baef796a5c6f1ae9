"""An independent judge of the demo's pictures: the shape, colour, horizontal position and size
of the largest region that differs from the background.

It knows only what the words mean (the palette, the three shapes, thirds of the width), not how
the training data is drawn, and is checked on pictures drawn in its own tests
(``tests/models/demo/test_analyser.py``) before it judges the model.

* background: median colour of the border pixels;
* foreground: the largest 4-connected region farther from the background than half the distance
  from the background to the region's own colour (so soft or blurred edges are cut where a
  sharp edge would be);
* colour: the region's median colour, named by the nearest palette colour;
* position: the region's centroid in the left, middle or right third;
* shape: the best intersection-over-union of the region with a circle (ellipse), a square
  (rectangle) and an upward triangle fitted to its bounding box — the fill ratio of the box
  (1 square, pi/4 circle, 1/2 triangle) plus where the fill lies;
* size: the radius of the circle around the shape, estimated from the area and the shape
  (small shapes are drawn with radius <= 8 px, large ones >= 11 px).
"""

from __future__ import annotations

from collections import deque

import numpy as np

# What the colour words mean, restated here so that a change to the training data cannot
# silently change the judge.
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
SHAPES = ("circle", "square", "triangle")
MIN_REGION = 12  # pixels; anything smaller is noise, not a shape
SEED_THRESHOLD = 60.0  # RGB distance that certainly separates a palette colour from a background
# Area of each shape drawn inside a circle of radius r, divided by r^2: a circle, a square of
# half-side 0.85 r and an equilateral triangle inscribed in the circle.
AREA_PER_R2 = {"circle": np.pi, "square": 4 * 0.85**2, "triangle": 3 * np.sqrt(3) / 4}
SIZE_SPLIT_RADIUS = 9.5  # between small (<= 8 px) and large (>= 11 px)


def _largest_region(mask: np.ndarray) -> np.ndarray | None:
    """Largest 4-connected component of ``mask`` (flood fill; the pictures are tiny)."""
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


def _templates(y0: int, y1: int, x0: int, x1: int, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Circle, square and upward triangle filling the box rows y0..y1, columns x0..x1 (inclusive),
    sampled at pixel centres."""
    yy, xx = np.mgrid[: shape[0], : shape[1]].astype(np.float32)
    top, bottom, left, right = y0 - 0.5, y1 + 0.5, x0 - 0.5, x1 + 0.5
    cy, cx = (top + bottom) / 2, (left + right) / 2
    ry, rx = (bottom - top) / 2, (right - left) / 2
    inside_box = (yy >= top) & (yy <= bottom) & (xx >= left) & (xx <= right)
    ellipse = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
    # apex at the top centre, base along the bottom: half-width grows linearly downwards
    half_width = rx * (yy - top) / (bottom - top)
    triangle = inside_box & (np.abs(xx - cx) <= half_width)
    return {"circle": ellipse, "square": inside_box, "triangle": triangle}


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


def analyse(image: np.ndarray) -> dict:
    """-> {"shape", "colour", "position", "size"} (each None when there is no shape) plus the
    measurements behind them: "area", "fill" (area / bounding box), "iou" per shape, "radius"."""
    img = np.asarray(image, dtype=np.float32)[..., :3]
    h, w, _ = img.shape
    border = np.concatenate([img[0], img[-1], img[:, 0], img[:, -1]])
    background = np.median(border, axis=0)
    distance = np.linalg.norm(img - background, axis=-1)
    seed = _largest_region(distance > SEED_THRESHOLD)
    if seed is None:
        return {"shape": None, "colour": None, "position": None, "size": None, "area": 0}
    core = np.median(img[seed & (distance >= np.percentile(distance[seed], 50))], axis=0)
    # cut where a sharp edge would be: halfway between the background and the shape's colour
    region = _largest_region(distance > max(SEED_THRESHOLD / 2, 0.5 * float(np.linalg.norm(core - background))))
    if region is None:
        region = seed

    colour = np.median(img[region], axis=0)
    names = list(PALETTE)
    refs = np.array([PALETTE[n] for n in names], dtype=np.float32)
    colour_name = names[int(np.argmin(np.linalg.norm(refs - colour, axis=-1)))]

    ys, xs = np.nonzero(region)
    cx = float(xs.mean() + 0.5) / w
    position = "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "center"

    y0, y1, x0, x1 = int(ys.min()), int(ys.max()), int(xs.min()), int(xs.max())
    area = int(region.sum())
    iou = {name: _iou(region, t) for name, t in _templates(y0, y1, x0, x1, region.shape).items()}
    shape = max(iou, key=iou.get)
    radius = float(np.sqrt(area / AREA_PER_R2[shape]))
    return {
        "shape": shape,
        "colour": colour_name,
        "position": position,
        "size": "large" if radius > SIZE_SPLIT_RADIUS else "small",
        "area": area,
        "fill": area / ((y1 - y0 + 1) * (x1 - x0 + 1)),
        "iou": iou,
        "radius": radius,
    }
