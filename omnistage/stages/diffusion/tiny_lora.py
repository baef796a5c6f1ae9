"""Tiny LoRA files for the tiny diffusion fixtures: random, non-zero ``lora_A`` and ``lora_B`` on chosen
``nn.Linear`` layers of a denoiser, written by diffusers' own ``save_lora_weights`` (so diffusers'
``load_lora_weights`` reads them as it reads a trained adapter)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn


def random_lora(
    model: nn.Module,
    targets: str,
    rank: Callable[[str], int] | int,
    seed: int,
    alpha: float | None = None,
    std: float = 0.3,
) -> dict[str, torch.Tensor]:
    """PEFT-layout weights (``<module>.lora_A.weight`` / ``lora_B.weight``) for every ``nn.Linear`` whose path
    fully matches the regex ``targets``; with ``alpha``, each layer also gets a kohya-style ``.alpha`` entry."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or not re.fullmatch(targets, name):
            continue
        r = rank(name) if callable(rank) else rank
        out[f"{name}.lora_A.weight"] = torch.randn(r, module.in_features, generator=g) * std
        out[f"{name}.lora_B.weight"] = torch.randn(module.out_features, r, generator=g) * std
        if alpha is not None:
            out[f"{name}.alpha"] = torch.tensor(float(alpha))
    if not out:
        raise ValueError(f"no nn.Linear of {type(model).__name__} matches {targets!r}")
    return out


def save(pipeline_class: Any, outdir: Path, layers: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    """``pytorch_lora_weights.safetensors`` in ``outdir`` (with diffusers' LoRA metadata when given)."""
    kwargs: dict[str, Any] = {"transformer_lora_layers": layers, "safe_serialization": True}
    if metadata is not None:
        kwargs["transformer_lora_adapter_metadata"] = metadata
    pipeline_class.save_lora_weights(str(outdir), **kwargs)
