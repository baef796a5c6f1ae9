"""What a finished request produced, merged over its final stages (the routes build their answers from it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnistage.outputs import OmniRequestOutput


@dataclass
class Result:
    """Everything a finished request produced, merged over its final stages."""

    text: str | None = None
    images: list[Any] = field(default_factory=list)
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    video: np.ndarray | None = None
    fps: float | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)

    def add(self, out: OmniRequestOutput, text_stages: set[int]) -> None:
        self.text = out.text if out.text is not None else self.text
        self.images = list(out.images) if out.images else self.images
        if out.audio is not None:
            self.audio, self.sample_rate = out.audio, out.sample_rate
        if out.video is not None:
            self.video, self.fps = out.video, out.fps
        self.finish_reason = out.finish_reason or self.finish_reason
        self.metrics.update(out.metrics or {})
        if out.num_prompt_tokens:
            self.prompt_tokens = max(self.prompt_tokens, out.num_prompt_tokens)
        tokens = sum(int(m.get("num_tokens", 0)) for sid, m in (out.metrics or {}).items() if sid in text_stages)
        self.completion_tokens = max(self.completion_tokens, tokens)
