"""Synthetic captioned shapes: the training data of the built-in demo pipeline.

Each picture is one flat-coloured circle, square or triangle on a flat background,
64x64, at the left, centre or right, small or large. Captions name the shape's
colour, shape and position, and sometimes its size and the background colour.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

SIZE = 64

# Shape colours and background colours use different words, so a colour word in a
# caption is never ambiguous between the shape and the background.
COLOURS = {
    "red": (220, 30, 30),
    "orange": (245, 135, 20),
    "yellow": (240, 220, 30),
    "green": (40, 170, 60),
    "cyan": (30, 200, 220),
    "blue": (40, 70, 220),
    "purple": (140, 50, 190),
    "pink": (245, 120, 190),
}
BACKGROUNDS = {
    "black": (15, 15, 15),
    "white": (240, 240, 240),
    "gray": (128, 128, 128),
    "brown": (100, 65, 40),
}
SHAPES = ("circle", "square", "triangle")
POSITIONS = {"left": 16, "center": 32, "right": 48}  # x of the shape's centre
SIZES = {"small": (6.0, 8.0), "large": (11.0, 13.0)}  # radius range in pixels

POSITION_PHRASES = {"left": "on the left", "center": "in the center", "right": "on the right"}


@dataclass(frozen=True)
class Scene:
    colour: str
    shape: str
    position: str
    size: str
    background: str
    dx: float  # jitter of the centre, pixels
    dy: float
    radius: float
    shade: tuple[int, int, int]  # small per-image colour jitter


def random_scene(rng: np.random.Generator) -> Scene:
    size = str(rng.choice(list(SIZES)))
    lo, hi = SIZES[size]
    return Scene(
        colour=str(rng.choice(list(COLOURS))),
        shape=str(rng.choice(SHAPES)),
        position=str(rng.choice(list(POSITIONS))),
        size=size,
        background=str(rng.choice(list(BACKGROUNDS))),
        dx=float(rng.uniform(-3, 3)),
        dy=float(rng.uniform(-8, 8)),
        radius=float(rng.uniform(lo, hi)),
        shade=tuple(int(v) for v in rng.integers(-12, 13, size=3)),
    )


def render(scene: Scene, supersample: int = 4) -> np.ndarray:
    """Draw the scene; returns uint8 [64, 64, 3]. Supersampling gives soft edges."""
    s = supersample
    bg = BACKGROUNDS[scene.background]
    img = Image.new("RGB", (SIZE * s, SIZE * s), bg)
    draw = ImageDraw.Draw(img)
    fill = tuple(int(np.clip(c + d, 0, 255)) for c, d in zip(COLOURS[scene.colour], scene.shade))
    cx = (POSITIONS[scene.position] + scene.dx) * s
    cy = (SIZE / 2 + scene.dy) * s
    r = scene.radius * s
    if scene.shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif scene.shape == "square":
        h = r * 0.85
        draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
    else:  # triangle pointing up, inscribed in the circle of radius r
        pts = [(cx + r * np.cos(a), cy - r * np.sin(a)) for a in (np.pi / 2, np.pi * 7 / 6, np.pi * 11 / 6)]
        draw.polygon(pts, fill=fill)
    return np.asarray(img.resize((SIZE, SIZE), Image.LANCZOS))


def caption(scene: Scene, rng: np.random.Generator) -> str:
    """A caption with optional size and background phrases (so short prompts work too)."""
    words = ["a"]
    if rng.random() < 0.5:
        words.append(scene.size)
    words += [scene.colour, scene.shape, POSITION_PHRASES[scene.position]]
    if rng.random() < 0.5:
        words.append(f"on a {scene.background} background")
    return " ".join(words)


def vocabulary_words() -> list[str]:
    """Every word the captions use (the tokenizer gives each one a token)."""
    return ["a", "on", "the", "in", "background", *COLOURS, *BACKGROUNDS, *SHAPES, *POSITIONS, *SIZES]


def make_dataset(n: int, seed: int) -> tuple[np.ndarray, list[Scene]]:
    rng = np.random.default_rng(seed)
    scenes = [random_scene(rng) for _ in range(n)]
    images = np.stack([render(s) for s in scenes])
    return images, scenes
