"""The accuracy judge must itself be right before it judges the model: on pictures drawn here with
PIL (not with the demo's training code) it must name every shape, colour, position and size, also
when the edges are blurred and the pixels noisy the way a generated picture's are, and it must
find no shape where there is none."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFilter

from tests.models.demo.analyser import PALETTE, SHAPES, analyse

BACKGROUNDS = [(15, 15, 15), (240, 240, 240), (128, 128, 128), (100, 65, 40), (30, 30, 80)]
CENTRES = {"left": 14.0, "center": 32.0, "right": 50.0}
RADII = {"small": (6.0, 8.0), "large": (11.0, 13.0)}  # radius of the circle the shape is drawn in


def draw(
    shape: str,
    colour: tuple[int, int, int],
    background: tuple[int, int, int],
    cx: float,
    cy: float,
    r: float,
    scale: int = 4,
) -> Image.Image:
    """One shape, drawn at ``scale`` times the size and shrunk (soft, anti-aliased edges)."""
    img = Image.new("RGB", (64 * scale, 64 * scale), background)
    d = ImageDraw.Draw(img)
    x, y, r = cx * scale, cy * scale, r * scale
    if shape == "circle":
        d.ellipse([x - r, y - r, x + r, y + r], fill=colour)
    elif shape == "square":
        d.rectangle([x - 0.85 * r, y - 0.85 * r, x + 0.85 * r, y + 0.85 * r], fill=colour)
    else:  # apex up, corners on the circle
        d.polygon([(x, y - r), (x - 0.866 * r, y + 0.5 * r), (x + 0.866 * r, y + 0.5 * r)], fill=colour)
    return img.resize((64, 64), Image.BILINEAR if scale > 1 else Image.NEAREST)


def cases(n: int, seed: int):
    rng = np.random.default_rng(seed)
    for k in range(n):
        shape, colour, position, size = (
            SHAPES[k % 3],
            list(PALETTE)[k % 8],
            list(CENTRES)[(k // 3) % 3],
            list(RADII)[(k // 9) % 2],
        )
        background = BACKGROUNDS[k % len(BACKGROUNDS)]
        r = rng.uniform(*RADII[size])
        cx = CENTRES[position] + rng.uniform(-3, 3)
        cy = 32 + rng.uniform(-8, 8)
        yield (shape, colour, position, size), draw(shape, PALETTE[colour], background, cx, cy, r)


def judge(image: Image.Image | np.ndarray) -> tuple:
    got = analyse(np.asarray(image))
    return got["shape"], got["colour"], got["position"], got["size"]


def test_clean_drawings_are_read_exactly():
    for want, image in cases(240, seed=1):
        assert judge(image) == want, want


def test_sharp_edges_are_read_exactly():
    rng = np.random.default_rng(2)
    for k in range(60):
        shape, size = SHAPES[k % 3], list(RADII)[k % 2]
        image = draw(shape, PALETTE["blue"], BACKGROUNDS[k % 4], 32, 32, rng.uniform(*RADII[size]), scale=1)
        assert judge(image) == (shape, "blue", "center", size)


@pytest.mark.parametrize("blur,noise", [(0.8, 0.0), (0.0, 12.0), (0.8, 12.0)])
def test_blurred_and_noisy_drawings_are_read(blur, noise):
    rng = np.random.default_rng(3)
    for want, image in cases(120, seed=4):
        if blur:
            image = image.filter(ImageFilter.GaussianBlur(blur))
        pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, noise, (64, 64, 3))
        assert judge(np.clip(pixels, 0, 255).astype(np.uint8)) == want, want


def test_no_shape_and_off_palette_pictures():
    flat = np.full((64, 64, 3), 128, np.uint8)
    assert analyse(flat)["shape"] is None and analyse(flat)["colour"] is None
    speck = flat.copy()
    speck[30:33, 30:33] = (220, 30, 30)  # 9 pixels: noise, not a shape
    assert analyse(speck)["shape"] is None


def test_the_largest_region_is_judged_and_mirroring_moves_it():
    image = np.asarray(draw("square", PALETTE["red"], BACKGROUNDS[0], 14, 32, 12.0)).copy()
    image[5:12, 50:57] = PALETTE["green"]  # a small second region on the right
    assert judge(image) == ("square", "red", "left", "large")
    assert judge(image[:, ::-1]) == ("square", "red", "right", "large")


def test_a_blob_is_not_a_triangle_and_a_bar_is_not_a_circle():
    # what an untrained model draws: a round blob reads as a circle, never as the asked triangle
    blob = draw("circle", PALETTE["green"], BACKGROUNDS[2], 32, 32, 9.0).filter(ImageFilter.GaussianBlur(1.5))
    assert judge(blob)[0] == "circle"
    bar = Image.new("RGB", (64, 64), BACKGROUNDS[0])
    ImageDraw.Draw(bar).rectangle([20, 28, 44, 36], fill=PALETTE["cyan"])
    assert judge(bar)[0] == "square"  # a filled box: no round or pointed outline
