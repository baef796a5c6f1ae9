"""Image-to-image source images -> GLM-Image VQ token ids, with the model's own vision encoder and VQ.

Runs in the AR stage's process, once per request: the ids go to vLLM (the AR
model reads them in place of the prompt's ``<|image|>`` placeholders) and, with
their grids, to the diffusion stage. Only the vision encoder and the VQ are
loaded (the AR decoder stays on the meta device), using transformers' own
``GlmImageModel.get_image_features`` / ``get_image_tokens``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

_PARTS = ("visual", "vqmodel")


def _weights(folder: Path, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    out = {}
    for name in files:
        with safe_open(str(folder / name), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys() if k.startswith(prefixes)})
    return out


class SourceImageTokenizer:
    def __init__(self, model: Any):
        self.model = model  # transformers GlmImageModel; only visual/vqmodel hold weights

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype = torch.float32) -> SourceImageTokenizer:
        from transformers import (
            GlmImageConfig,
            GlmImageModel,
            GlmImageVisionModel,
            GlmImageVQVAE,
        )

        folder = Path(folder)
        config = GlmImageConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = GlmImageModel(config)
        model.visual = GlmImageVisionModel(config.vision_config)
        model.vqmodel = GlmImageVQVAE(config.vq_config)
        state = _weights(folder, tuple(f"model.{p}." for p in _PARTS))
        for part in _PARTS:
            prefix = f"model.{part}."
            getattr(model, part).load_state_dict(
                {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}, strict=True
            )
            getattr(model, part).to(dtype).eval()
        return cls(model)

    @torch.no_grad()
    def tokenize(self, pixel_values: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        """Processor outputs of the source images -> their VQ ids, concatenated in grid order."""
        features = self.model.get_image_features(pixel_values, grids).pooler_output
        return self.model.get_image_tokens(features, grids).view(-1)
