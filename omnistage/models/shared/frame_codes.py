"""The whole-utterance edge of the frame-per-step speech LMs (csm, higgs_audio, qwen3_tts, omnivoice): their
``token_ids`` rows, one [K codes] row per frame, as the decoder's codes [K, frames]. The streamed edge is
``stages.ar.params.frames_in_chunks``."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError


def whole_frame_codes(source: dict[str, Any], no_frames: str) -> dict[str, Any]:
    """``{"codes": [K, frames]}`` from ``source``'s rows; no frame at all is a 400 naming ``input`` (the text is
    the only thing the caller controls that led there), ``no_frames`` saying what happened."""
    frames = source.get("token_ids")
    if frames is None or len(frames) == 0:
        raise InvalidRequestError("input", no_frames)
    return {"codes": torch.as_tensor(frames).T.contiguous()}
