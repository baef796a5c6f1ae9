"""What the Qwen-Omni cost benchmarks share (omni_hidden_cost.py, omni25_hidden_cost.py, omni25_streaming.py): the
model folder, and writing a result as ``benchmarks/results/<name>.json`` + ``<name>.md`` (the table, also printed)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def model_folder(model: str | None, tiny_name: str) -> Path:
    """``--model``, else the tiny fixture ``tiny_name`` built in a temporary folder."""
    if model:
        return Path(model)
    from omnistage.testing.tiny import build

    return build(tiny_name, Path(tempfile.mkdtemp(prefix=f"omnistage-bench-{tiny_name}-")) / "model")


def write_result(name: str, result: dict[str, Any], lines: list[str]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
