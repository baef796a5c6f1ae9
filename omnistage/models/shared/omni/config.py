"""Reading a Qwen-Omni checkpoint's ``config.json`` (without torch: the server reads it before any engine starts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.pipeline import read_json


def read_omni_config(folder: Path, architecture: str) -> dict[str, Any]:
    """``folder/config.json``, which must name ``architecture`` (else a ``ValueError`` naming the file)."""
    raw = read_json(folder / "config.json")
    if architecture not in (raw.get("architectures") or []):
        raise ValueError(
            f"{folder / 'config.json'}: architectures {raw.get('architectures')} does not name {architecture}"
        )
    return raw
