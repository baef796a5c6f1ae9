"""The new audio an output brought, as the streaming answers send it (chat SSE, ``/v1/realtime``)."""

from __future__ import annotations

import numpy as np

from omnistage.outputs import OmniRequestOutput


def audio_delta(out: OmniRequestOutput) -> np.ndarray | None:
    """The output's new audio as float32 mono, or None when it brought none."""
    audio = out.delta.get("audio")
    if audio is None:
        return None
    arr = np.asarray(audio.detach().cpu() if hasattr(audio, "detach") else audio, dtype=np.float32).reshape(-1)
    return arr if arr.size else None
