"""The tiny LongCat-AudioDiT folder and diffusers' own pipeline on it (the reference every test compares with)."""

from __future__ import annotations

from typing import Any

import pytest
import torch


@pytest.fixture(scope="session")
def longcat_audio_dir(tiny_model):
    return tiny_model("longcat_audio")


@pytest.fixture(scope="session")
def reference(longcat_audio_dir):
    """``reference(prompt, seed=…, duration=…, …)``: ``LongCatAudioDiTPipeline.__call__``'s clip, float32
    [samples] (diffusers' defaults for whatever is not given)."""
    from diffusers import LongCatAudioDiTPipeline

    pipe = LongCatAudioDiTPipeline.from_pretrained(longcat_audio_dir)
    pipe.set_progress_bar_config(disable=True)

    def run(prompt: str, *, seed: int, duration: float | None = None, **kwargs: Any):
        generator = torch.Generator().manual_seed(seed)
        out = pipe(prompt, audio_duration_s=duration, generator=generator, **kwargs).audios
        return out[0, 0]  # np float32 [batch, channels=1, samples]

    return run
