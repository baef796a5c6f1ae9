"""The edge LM -> decoder: ``latent`` patches [P, D] in (and a continued clip's ``context`` [D, C] once), latent
frames [D, n] out.

Streamed (async chunk): the first ``initial_codec_chunk_frames`` patches as soon as they exist, then every
``chunk_frames`` patches (the decoder stage's params, per request or deploy), the rest when the LM finishes.
Whole: every frame at once.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.voxcpm.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
from omnistage.pipeline import chunk_size

NO_AUDIO = "VoxCPM2 produced no audio for this input"


def whole_latents(source: dict[str, Any], request: Any) -> dict[str, Any]:
    latent = source.get("latent")
    if latent is None or len(latent) == 0:
        raise InvalidRequestError("input", NO_AUDIO)
    return {"latents": torch.as_tensor(latent).T.contiguous(), "context": source.get("context")}


def latents_in_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    pending: list[torch.Tensor] = state.setdefault("pending", [])
    if delta.get("context") is not None:
        state["context"] = delta["context"]
    if delta.get("latent") is not None:
        pending.append(torch.as_tensor(delta["latent"]))
    sent = state.get("sent", 0)
    n = len(pending)
    if state.get("finished"):
        take = n
    elif sent == 0:
        take = n if n >= chunk_size(request, 1, "initial_codec_chunk_frames", INITIAL_CHUNK_FRAMES) else 0
    else:
        every = chunk_size(request, 1, "chunk_frames", CHUNK_FRAMES)
        take = n - n % every
    if take == 0:
        if state.get("finished") and not sent:
            raise InvalidRequestError("input", NO_AUDIO)
        return None
    out = {"latents": torch.cat(pending[:take]).T.contiguous(), "streamed": True}
    if sent == 0 and state.get("context") is not None:
        out["context"] = state["context"]
    del pending[:take]
    state["sent"] = sent + take
    return out
