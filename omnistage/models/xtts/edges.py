"""The edge GPT -> decoder: one ``latent`` row [1, d] per step in (the speaker embedding and ``speed`` with
the first), latents out.

Whole (async chunk off, or a caller that reads only the final audio: ``request.stream`` False, as a whole HTTP
answer and offline ``Omni.generate`` are): every latent at once, decoded as the release's ``inference``
decodes them. Streamed: as the release's ``inference_stream`` streams, a
piece every ``chunk_frames`` steps (its ``stream_chunk_size``, default 20) and one when the GPT finishes; each
piece carries every latent so far, because the release decodes all of them again for every piece and
cross-fades the new audio into the old (``codec.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.xtts.config import STREAM_CHUNK_CODES
from omnistage.pipeline import chunk_size

NO_LATENTS = "XTTS produced no audio for this input"


def whole_latents(source: dict[str, Any], request: Any) -> dict[str, Any]:
    latents = source.get("latent")
    if latents is None or len(latents) == 0:
        raise InvalidRequestError("input", NO_LATENTS)
    return {"latents": torch.as_tensor(latents), "speaker": _first(source["speaker"]), "speed": _first(source["speed"])}


def latents_in_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    for key in ("speaker", "speed"):
        if key in delta:
            state[key] = _first(delta[key])
    if delta.get("latent") is not None:
        state.setdefault("latents", []).append(torch.as_tensor(delta["latent"]))
        state["new"] = state.get("new", 0) + 1
    if not state.get("latents"):
        if state.get("finished"):
            raise InvalidRequestError("input", NO_LATENTS)
        return None
    latents = torch.cat(state["latents"])
    state["latents"] = [latents]
    whole = {"latents": latents, "speaker": state["speaker"], "speed": state["speed"]}
    if not getattr(request, "stream", True):
        return whole if state.get("finished") else None
    every = chunk_size(request, 1, "chunk_frames", STREAM_CHUNK_CODES)
    if not state.get("finished") and state.get("new", 0) < every:
        return None
    state["new"] = 0
    return {**whole, "streamed": True}


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) else value
