"""The edge code stage -> decoder: the utterance's ``token_ids`` [frames, 8] in, codes [8, frames] out (and a
cloned voice's loudness)."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError


def whole_codes(source: dict[str, Any], request: Any) -> dict[str, Any]:
    frames = source.get("token_ids")
    if frames is None or len(frames) == 0:
        raise InvalidRequestError("input", "OmniVoice produced no codes for this input")
    out = {"codes": torch.as_tensor(frames).T.contiguous()}
    if source.get("ref_rms") is not None:  # a cloned voice: the speech takes the clip's loudness
        out["ref_rms"] = float(source["ref_rms"])
    return out
