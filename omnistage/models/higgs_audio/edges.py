"""The edge LM -> decoder: one ``token_ids`` row [N codes] per un-delayed frame in, codes [N, frames] out.

Streamed (async chunk): the first ``initial_codec_chunk_frames`` frames with the decoder's lookahead after them
(``LOOKAHEAD_FRAMES``: the first block cannot be decoded before they exist, and sending the first frames alone
would make the first block wait for the next piece), then every ``chunk_frames`` (the decoder stage's params,
per request or deploy), the rest when the LM finishes.
"""

from __future__ import annotations

from typing import Any

from omnistage.models.higgs_audio.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES, LOOKAHEAD_FRAMES
from omnistage.models.shared.frame_codes import whole_frame_codes
from omnistage.stages.ar.params import frames_in_chunks

NO_FRAMES = "Higgs Audio produced no audio frame for this input (its speech ended before a whole frame)"


def whole_codes(source: dict[str, Any], request: Any) -> dict[str, Any]:
    return whole_frame_codes(source, NO_FRAMES)


def codes_in_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    return frames_in_chunks(
        delta,
        request,
        state,
        first_default=INITIAL_CHUNK_FRAMES,
        every_default=CHUNK_FRAMES,
        no_frames=NO_FRAMES,
        lookahead=LOOKAHEAD_FRAMES,
    )
