"""What callers of Omni / AsyncOmni receive."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class OmniRequestOutput:
    """One request's output from one final stage.

    Fields hold everything produced so far (cumulative); ``delta`` holds only
    what arrived with this update (for streaming text/audio to a client).
    """

    request_id: str
    stage_id: int
    final_output_type: str
    finished: bool
    text: str | None = None
    token_ids: list[int] | None = None
    images: list[Any] = field(default_factory=list)  # PIL.Image.Image
    audio: np.ndarray | None = None  # float32 [samples]
    sample_rate: int | None = None
    video: np.ndarray | None = None  # uint8 [T, H, W, 3]
    fps: float | None = None
    latents: Any = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    num_tokens: int | None = None  # tokens generated so far by this (llm) stage
    delta: dict[str, Any] = field(default_factory=dict)
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)  # stage id -> StageMetrics.to_dict()
    progress: tuple[int, int] | None = None
    error: str | None = None

    @property
    def modalities(self) -> list[str]:
        have = {"text": self.text, "token_ids": self.token_ids, "image": self.images or None,
                "audio": self.audio, "video": self.video, "latent": self.latents}
        return [k for k, v in have.items() if v is not None]
