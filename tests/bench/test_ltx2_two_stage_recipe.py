"""The baseline of ``diffusion_batching.py --family ltx2_two_stage`` (``benchmarks/ltx2_two_stage_recipe.py``) is
diffusers' published two-stage recipe: on the tiny LTX-2 folder, one call equals the recipe as the two-stage
deploy's equality test runs it (``tests/models/ltx2/two_stage_recipe.py``), and its batched form (the benchmark's
"ideal") gives each row the frames that row gets alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.models.ltx2.two_stage_recipe import FIRST, FPS, NEGATIVE, PROMPT, SEED, SIZE, STG, run_recipe

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _recipe_class():
    spec = importlib.util.spec_from_file_location(
        "ltx2_two_stage_recipe", ROOT / "benchmarks" / "ltx2_two_stage_recipe.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LTX2TwoStageRecipe


def test_benchmark_recipe_is_the_published_recipe(tiny_model):
    torch.set_num_threads(1)
    folder = tiny_model("ltx2")
    recipe = _recipe_class().from_pretrained(str(folder), dtype=torch.float32)
    recipe.set_progress_bar_config(disable=True)
    kw = dict(**SIZE, **FIRST, negative_prompt=NEGATIVE, frame_rate=float(FPS), **STG)

    def frames(video: np.ndarray) -> np.ndarray:
        return (video * 255).round().astype(np.uint8)

    video, audio = recipe(PROMPT, generator=torch.Generator().manual_seed(SEED), **kw)
    want_frames, want_wave = run_recipe(folder)
    # the same calls in the same order on the same weights: equal to the bit (fp32, CPU)
    assert np.array_equal(frames(video[0]), want_frames)
    assert torch.equal(audio[0].float(), torch.from_numpy(want_wave))

    other = "a blue chair"
    alone, _ = recipe(other, generator=torch.Generator().manual_seed(SEED + 1), **kw)
    both, waves = recipe([PROMPT, other], generator=[torch.Generator().manual_seed(s) for s in (SEED, SEED + 1)], **kw)
    assert both.shape[0] == 2
    # measured: a row of the batch-2 call is within 1e-6 of its solo call (float sums blocked otherwise for two
    # rows), which can move a rounded uint8 level by one
    for got, want in zip(both, (video[0], alone[0])):
        assert np.abs(got - want).max() < 1e-5
        assert np.abs(frames(got).astype(int) - frames(want).astype(int)).max() <= 1
    assert (waves[0].float() - audio[0].float()).abs().max() < 1e-5
