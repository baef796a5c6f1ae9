"""The edges thinker -> talker (whole, or streamed with async chunk on: the default) and talker -> token2wav (whole).

thinker -> talker: the thinker's rendered prompt ids, the reply's ids, its hidden states of the prompt and of the
reply fed back (``talker_rows``: ``rows``), the media grids (``talker_media``: ``media``; thinker.py) and the
speaker the request names. Streamed, every thinker output is forwarded at once: the talker prefills once the
prompt's rows and the first reply token's have come (the thinker's second output) and steps as the rows of later
tokens arrive. talker -> token2wav: the codes [n] and the same speaker (the request's, else the talker's
``speaker`` sampling param, else the default); token2wav's DiT attends across the whole code sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omnistage.models.shared.omni.edges import first_chunk


def request_speaker(request: Any) -> str | None:
    """The voice a request asks for: its speech input's ``voice`` (HTTP routes put it there), else the talker's
    own ``speaker`` sampling param, else None (the default speaker)."""
    speech = request.prompt.get("speech")
    if speech is not None and speech.voice:
        return speech.voice
    params = request.sampling_params
    talker = params[1] if len(params) > 1 and isinstance(params[1], Mapping) else {}
    return talker.get("speaker")


def _first(value: Any) -> Any:
    """An auxiliary key accumulates as a list of items: its one item."""
    return value[0] if isinstance(value, list) and value and not isinstance(value[0], int) else value


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return value.tolist() if hasattr(value, "tolist") else [int(t) for t in value]


def thinker_to_talker(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """Async chunk off: the whole reply at once."""
    return {
        "prompt_token_ids": _ids(_first(source.get("prompt_token_ids"))),
        "token_ids": _ids(source.get("token_ids")),
        "rows": source.get("talker_rows"),
        "media": _first(source.get("talker_media")),
        "speaker": request_speaker(request),
    }


def thinker_to_talker_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    """Async chunk on: every thinker output as it comes (the first with the prompt ids and the speaker)."""
    chunk = first_chunk(delta, state, request_speaker(request))
    if delta.get("token_ids") is not None:
        chunk["token_ids"] = _ids(delta["token_ids"])
    if delta.get("talker_rows") is not None:
        chunk["rows"] = delta["talker_rows"]
    if delta.get("talker_media") is not None:
        chunk["media"] = delta["talker_media"]
    return chunk or None


def talker_to_token2wav(source: dict[str, Any], request: Any) -> dict[str, Any]:
    codes = source.get("token_ids")
    if codes is None or len(codes) == 0:
        return {}  # the talker had nothing to say (the thinker stopped on its first token): token2wav makes no audio
    return {"codes": torch.as_tensor(codes).reshape(-1).long(), "speaker": request_speaker(request)}
