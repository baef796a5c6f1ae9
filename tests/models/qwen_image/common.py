"""What the Qwen-Image tests share: tiny sizes, seeded generators and images, diffusers' pipelines as the
reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

# the engine may return latents as well as images
DEPLOY = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent"}]}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def image(h: int, w: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def reference(cls_name: str, folder: str | Path) -> Any:
    """diffusers' own pipeline from the folder (progress bar off); the edit pipelines load the folder's
    transformers Qwen2VLProcessor themselves."""
    import diffusers

    pipe = getattr(diffusers, cls_name).from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe
