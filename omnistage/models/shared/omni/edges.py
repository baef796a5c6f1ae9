"""The thinker -> talker edge's start, which both Qwen-Omni families stream the same way."""

from __future__ import annotations

from typing import Any


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return value.tolist() if hasattr(value, "tolist") else [int(t) for t in value]


def first_chunk(delta: dict[str, Any], state: dict[str, Any], speaker: str | None) -> dict[str, Any]:
    """A streamed thinker -> talker chunk's start: the first one carries the prompt ids and the speaker."""
    if state.get("started") or delta.get("prompt_token_ids") is None:
        return {}
    state["started"] = True
    return {"prompt_token_ids": _ids(delta["prompt_token_ids"]), "speaker": speaker}
