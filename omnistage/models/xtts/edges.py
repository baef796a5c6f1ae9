"""The edge GPT -> decoder: one ``latent`` row [1, d] per step in (the speaker embedding and ``speed`` with
the first), latents out.

Whole (async chunk off, or a caller that reads only the final audio: ``request.stream`` False, as a whole HTTP
answer and offline ``Omni.generate`` are): every latent at once, decoded as the release's ``inference``
decodes them. Streamed: as the release's ``inference_stream`` streams, a
piece every ``chunk_frames`` steps (its ``stream_chunk_size``, default 20) and one when the GPT finishes; each
piece carries every latent so far, because the release decodes all of them again for every piece and
cross-fades the new audio into the old (``codec.py``).

A text spoken sentence by sentence (``enable_text_splitting``): each latent comes with its sentence's index, which
the whole input carries on (``sentences``: the decoder decodes each sentence alone, as the release does); streamed,
the GPT's ``sentence_end`` closes the sentence's stream with a last piece (``sentence_end`` on it: the decoder
starts the next sentence's stream afresh), as the release's stream ends one sentence before the next.
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
    return {
        "latents": torch.as_tensor(latents),
        "sentences": _sentences(source.get("sentence"), len(latents)),
        "speaker": _first(source["speaker"]),
        "speed": _first(source["speed"]),
    }


def latents_in_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    for key in ("speaker", "speed"):
        if key in delta:
            state[key] = _first(delta[key])
    if delta.get("latent") is not None:
        state.setdefault("latents", []).append(torch.as_tensor(delta["latent"]))
        state.setdefault("sentences", []).append(_sentences(delta.get("sentence"), 1))
        state["new"] = state.get("new", 0) + 1
    ends_sentence = delta.get("sentence_end") is not None
    if not state.get("latents"):
        if state.get("finished"):
            raise InvalidRequestError("input", NO_LATENTS)
        return None
    latents, sentences = torch.cat(state["latents"]), torch.cat(state["sentences"])
    state["latents"], state["sentences"] = [latents], [sentences]
    whole = {"latents": latents, "sentences": sentences, "speaker": state["speaker"], "speed": state["speed"]}
    if not getattr(request, "stream", True):
        return whole if state.get("finished") else None
    every = chunk_size(request, 1, "chunk_frames", STREAM_CHUNK_CODES)
    if not state.get("finished") and not ends_sentence and state.get("new", 0) < every:
        return None
    state["new"] = 0
    if ends_sentence:  # the next sentence's stream starts from its own first latent
        state["latents"], state["sentences"] = [], []
    return {**whole, "streamed": True, "sentence_end": ends_sentence}


def _sentences(value: Any, n: int) -> torch.Tensor:
    """Each latent's sentence index ([n]; all 0 where the GPT sent none)."""
    return torch.zeros(n, dtype=torch.long) if value is None else torch.as_tensor(value).reshape(-1).long()


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) else value
