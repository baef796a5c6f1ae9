"""The tiny Wan VACE folder, diffusers' own ``WanVACEPipeline`` on it (the reference every test compares with), and
the inputs the tests send: a noise clip, a mask clip (left part white: regenerate it, keep the rest) and a reference
picture."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.stages.diffusion.helpers import gen, noise_image, reference_pipeline

STEPS = dict(num_inference_steps=2, max_sequence_length=16)  # the tiny UMT5 needs no 512 tokens


@pytest.fixture(scope="session")
def wan_vace_dir(tiny_model):
    return str(tiny_model("wan_vace"))


@pytest.fixture(scope="session")
def reference(wan_vace_dir):
    """``reference(prompt, seed, **call_kw)``: ``WanVACEPipeline.__call__``'s frames as uint8 [T, H, W, 3] (the
    rounding diffusers uses for PIL output)."""
    pipe = reference_pipeline("WanVACEPipeline", wan_vace_dir)

    def run(prompt: str, seed: int, **kw: Any) -> np.ndarray:
        out = pipe(prompt, generator=gen(seed), output_type="np", **{**STEPS, **kw}).frames[0]
        return (out * 255).round().astype(np.uint8)

    return run


def clip(frames: int, h: int, w: int, seed: int) -> list[Image.Image]:
    return [noise_image(h, w, seed + i) for i in range(frames)]


def mask_clip(frames: int, h: int, w: int, white_cols: int) -> list[Image.Image]:
    m = np.zeros((h, w, 3), np.uint8)
    m[:, :white_cols] = 255
    return [Image.fromarray(m) for _ in range(frames)]
