"""The tiny Stable Audio 3 folders and diffusers' own pipeline on them (the reference every test compares with)."""

from __future__ import annotations

from typing import Any

import pytest
import torch


@pytest.fixture(scope="session")
def stable_audio3_dir(tiny_model):
    return tiny_model("stable_audio3")  # ping-pong sampling (the distilled checkpoint's scheduler)


@pytest.fixture(scope="session")
def stable_audio3_base_dir(tiny_model):
    return tiny_model("stable_audio3_base")  # the same weights, deterministic Euler (the base checkpoint's)


def _reference(folder):
    from diffusers import StableAudio3Pipeline

    pipe = StableAudio3Pipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)

    def run(prompt: str, *, seed: int, **kwargs: Any):
        generator = torch.Generator().manual_seed(seed)
        return pipe(prompt, generator=generator, output_type="np", **kwargs).audios[0]  # float32 [2, samples]

    return run


@pytest.fixture(scope="session")
def reference(stable_audio3_dir):
    """``reference(prompt, seed=…, duration=…, …)``: ``StableAudio3Pipeline.__call__``'s clip on the ping-pong
    folder (diffusers' defaults for whatever is not given)."""
    return _reference(stable_audio3_dir)


@pytest.fixture(scope="session")
def base_reference(stable_audio3_base_dir):
    """The same on the Euler folder."""
    return _reference(stable_audio3_base_dir)
