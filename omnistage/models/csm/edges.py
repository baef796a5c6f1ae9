"""The edge backbone -> codec: one ``token_ids`` row [K codes] per frame in, codes [K, frames] out.

Streamed (async chunk): the first ``initial_codec_chunk_frames`` frames as soon as they exist, then
every ``chunk_frames`` (the codec stage's params, per request or deploy), the rest when the backbone
finishes. Mimi is causal, so the streamed audio equals the whole decode.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.csm.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
from omnistage.pipeline import chunk_size

NO_FRAMES = "CSM produced no audio frame for this input (its first frame was the end of speech)"  # a 400: see codec_tts


def whole_codes(source: dict[str, Any], request: Any) -> dict[str, Any]:
    frames = source.get("token_ids")
    if frames is None or len(frames) == 0:
        raise InvalidRequestError("input", NO_FRAMES)
    return {"codes": torch.as_tensor(frames).T.contiguous()}


def codes_in_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
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
    return {"codes": codes[:take].T.contiguous(), "streamed": True}
