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

from omnistage.models.qwen3_tts.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
from omnistage.models.shared.frame_codes import whole_frame_codes
from omnistage.stages.ar.params import frames_in_chunks

NO_FRAMES = "Qwen3-TTS produced no audio frame for this input (its first frame was the end of speech)"  # a 400


def _context(value: Any) -> torch.Tensor | None:
    if isinstance(value, list):  # an auxiliary key accumulates as a list of items
        value = value[0] if value else None
    return None if value is None else torch.as_tensor(value).T.contiguous()


def whole_codes(source: dict[str, Any], request: Any) -> dict[str, Any]:
    out = whole_frame_codes(source, NO_FRAMES)
    context = _context(source.get("ref_codes"))
    if context is not None:
        out["context"] = context
    return out


def codes_in_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    if delta.get("ref_codes") is not None:
        state["context"] = _context(delta["ref_codes"])
    first = state.get("sent", 0) == 0
    out = frames_in_chunks(
        delta, request, state, first_default=INITIAL_CHUNK_FRAMES, every_default=CHUNK_FRAMES, no_frames=NO_FRAMES
    )
    if out is not None and first and state.get("context") is not None:
        out["context"] = state["context"]
    return out
