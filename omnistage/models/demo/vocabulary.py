"""What the built-in demo can draw: the words of its training captions (``demo/shapes.py``), by kind.

The demo's tokenizer gives each of these words one token; any other word falls apart into characters the model
never learned from, so the picture cannot follow "at the top" or "a star". The server lists these
words in the demo's ``/v1/models`` entry, the playground offers the example prompts, and a prompt with other
words gets a warning back (``omnistage/drawable.py``). ``tests/models/demo`` checks that these
lists equal the training script's.
"""

from __future__ import annotations

VOCABULARY: dict[str, list[str]] = {
    "shape": ["circle", "square", "triangle"],
    "colour": ["red", "orange", "yellow", "green", "cyan", "blue", "purple", "pink"],
    "position": ["left", "center", "right"],  # across the picture only: never top / bottom
    "size": ["small", "large"],
    "background": ["black", "white", "gray", "brown"],
}

# The captions' other words ("a large red circle on the left on a gray background"), plus a few a person adds
# that change nothing ("an", "at", "and"); none of these earn a warning.
FILLER_WORDS: list[str] = ["a", "an", "on", "the", "in", "background", "at", "and", "with", "of"]

EXAMPLE_PROMPTS: list[str] = [
    "a red circle on the left",
    "a large yellow square on the right",
    "a small blue triangle in the center",
    "a green circle on the right on a black background",
    "a large purple triangle on the left on a white background",
    "a small pink square in the center on a brown background",
]
