"""The tiny Stable Audio folder and diffusers' own pipeline on it (the reference every test compares with)."""

from __future__ import annotations

from typing import Any

import pytest
import torch


@pytest.fixture(scope="session")
def stable_audio_dir(tiny_model):
    return tiny_model("stable_audio")


@pytest.fixture(scope="session")
def reference(stable_audio_dir):
    """``reference(prompt, seed=…, duration=…, …)``: ``StableAudioPipeline.__call__``'s clip, float32
    [channels, samples] (diffusers' defaults for whatever is not given)."""
    from diffusers import StableAudioPipeline

    pipe = StableAudioPipeline.from_pretrained(stable_audio_dir)
    pipe.set_progress_bar_config(disable=True)

    def run(prompt: str, *, seed: int, duration: float | None = None, **kwargs: Any):
        generator = torch.Generator().manual_seed(seed)
        out = pipe(prompt, audio_end_in_s=duration, generator=generator, **kwargs).audios
        return out[0].float().numpy()

    return run
