"""The edge code stage -> decoder: the utterance's ``token_ids`` [frames, 8] in, codes [8, frames] out (and a
cloned voice's loudness)."""

from __future__ import annotations

from typing import Any

from omnistage.models.shared.frame_codes import whole_frame_codes


def whole_codes(source: dict[str, Any], request: Any) -> dict[str, Any]:
    out = whole_frame_codes(source, "OmniVoice produced no codes for this input")
    if source.get("ref_rms") is not None:  # a cloned voice: the speech takes the clip's loudness
        out["ref_rms"] = float(source["ref_rms"])
    return out
