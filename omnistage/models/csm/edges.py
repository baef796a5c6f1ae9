"""The edge backbone -> codec: one ``token_ids`` row [K codes] per frame in, codes [K, frames] out.

Streamed (async chunk): the first ``initial_codec_chunk_frames`` frames as soon as they exist, then
every ``chunk_frames`` (the codec stage's params, per request or deploy), the rest when the backbone
finishes. Mimi is causal, so the streamed audio equals the whole decode.
"""

from __future__ import annotations

from typing import Any

from omnistage.models.csm.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
from omnistage.models.shared.frame_codes import whole_frame_codes
from omnistage.stages.ar.params import frames_in_chunks

NO_FRAMES = "CSM produced no audio frame for this input (its first frame was the end of speech)"  # a 400: see codec_tts


def whole_codes(source: dict[str, Any], request: Any) -> dict[str, Any]:
    return whole_frame_codes(source, NO_FRAMES)


def codes_in_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    return frames_in_chunks(
        delta, request, state, first_default=INITIAL_CHUNK_FRAMES, every_default=CHUNK_FRAMES, no_frames=NO_FRAMES
    )
