"""What a generation stage's adapter is given and returns (the engine that batches the calls: engine.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class GenerationItem:
    """One request's next input chunk; ``state`` persists across its chunks (e.g. a decoder's left context)."""

    request_id: str
    inputs: dict[str, Any]
    params: Any
    state: dict[str, Any]
    last: bool  # no more input will follow for this request


class GenerationAdapter(Protocol):
    def run(self, items: list[GenerationItem]) -> list[dict[str, Any]]: ...
