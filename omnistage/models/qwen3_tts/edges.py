"""The edge talker -> speech decoder: one ``token_ids`` row [G codes] per frame in, codes [G, frames] out.

An in-context clone's first talker output carries ``ref_codes`` [T, G] (the reference clip's codes): they
go with the first piece as the decoder's ``context``, decoded in front of the speech and never emitted, as
``qwen-tts`` decodes reference + generated codes together and cuts the reference's samples.

Streamed (async chunk): the first ``initial_codec_chunk_frames`` frames as soon as they exist, then every
``chunk_frames`` (the decoder stage's params, per request or deploy), the rest when the talker finishes.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.qwen3_tts.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
from omnistage.pipeline import chunk_size

NO_FRAMES = "Qwen3-TTS produced no audio frame for this input (its first frame was the end of speech)"  # a 400


def _context(value: Any) -> torch.Tensor | None:
    if isinstance(value, list):  # an auxiliary key accumulates as a list of items
        value = value[0] if value else None
    return None if value is None else torch.as_tensor(value).T.contiguous()


def whole_codes(source: dict[str, Any], request: Any) -> dict[str, Any]:
    frames = source.get("token_ids")
    if frames is None or len(frames) == 0:
        raise InvalidRequestError("input", NO_FRAMES)
    out = {"codes": torch.as_tensor(frames).T.contiguous()}
    context = _context(source.get("ref_codes"))
    if context is not None:
        out["context"] = context
    return out


def codes_in_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    if delta.get("ref_codes") is not None:
        state["context"] = _context(delta["ref_codes"])
    pending: list[torch.Tensor] = state.setdefault("pending", [])
    if delta.get("token_ids") is not None:
        pending.append(torch.as_tensor(delta["token_ids"]))
    frames = sum(p.shape[0] for p in pending)
    sent = state.get("sent", 0)
    if state.get("finished"):
        take = frames
    elif sent == 0:
        first = chunk_size(request, 1, "initial_codec_chunk_frames", INITIAL_CHUNK_FRAMES)
        take = frames if frames >= first else 0
    else:
        n = chunk_size(request, 1, "chunk_frames", CHUNK_FRAMES)
        take = frames - frames % n
    if take == 0:
        if state.get("finished") and not sent:
            raise InvalidRequestError("input", NO_FRAMES)
        return None
    codes = torch.cat(pending, dim=0)
    pending[:] = [codes[take:]] if take < frames else []
    state["sent"] = sent + take
    out = {"codes": codes[:take].T.contiguous(), "streamed": True}
    if sent == 0 and state.get("context") is not None:
        out["context"] = state["context"]
    return out
