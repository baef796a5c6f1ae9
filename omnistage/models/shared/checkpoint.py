"""Reading a safetensors checkpoint by name prefix, so a stage loads only its own modules' weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def _shards(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or an index)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.exists():
        raise ValueError(f"{folder}: no model.safetensors(.index.json)")
    from safetensors import safe_open

    with safe_open(str(single), "pt") as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 (a safetensors handle, not a dict)


def read_tensors(folder: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor whose name starts with ``prefix``, keyed without it."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name, path in _shards(Path(folder)).items():
        if name.startswith(prefix):
            by_file.setdefault(path, []).append(name)
    if not by_file:
        raise ValueError(f"{folder}: the checkpoint has no weights under {prefix!r}")
    out: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        with safe_open(str(path), "pt") as f:
            for name in names:
                out[name[len(prefix) :]] = f.get_tensor(name)
    return out
