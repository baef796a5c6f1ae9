"""The built-in demo pipeline: resolved with no model, loads the shipped weights, and
generates exactly what diffusers' own StableDiffusion3Pipeline generates from that folder."""

import json

import numpy as np
import pytest
import torch

from omnistage.pipeline import resolve_pipeline

PROMPTS = ["a red circle on the left", "a large blue square in the center on a white background"]


def test_no_model_resolves_the_demo_with_shipped_weights():
    from omnistage.models.demo import DEFAULT_PARAMS, WEIGHTS

    pipeline = resolve_pipeline(None)
    assert pipeline.name == "demo"
    assert pipeline.info.default_model == str(WEIGHTS)
    assert json.loads((WEIGHTS / "model_index.json").read_text())["_class_name"] == "StableDiffusion3Pipeline"
    # the folder names its pipeline, so serving it by path gets the demo's defaults too
    assert resolve_pipeline(WEIGHTS).name == "demo"
    size = sum(f.stat().st_size for f in WEIGHTS.rglob("*") if f.is_file())
    assert size <= 20e6, f"shipped weights are {size / 1e6:.1f} MB"
    info = json.loads((WEIGHTS / "training_info.json").read_text())
    assert info["max_sequence_length"] == DEFAULT_PARAMS["max_sequence_length"]


@pytest.fixture(scope="module")
def omni():
    from omnistage import Omni

    engine = Omni(model=None)
    yield engine
    engine.close()


def test_demo_matches_diffusers_reference(omni):
    from diffusers import StableDiffusion3Pipeline

    from omnistage.models.demo import DEFAULT_PARAMS, WEIGHTS

    together = omni.generate([{"prompt": p} for p in PROMPTS], [{"seed": 7}], use_tqdm=False)
    ref = StableDiffusion3Pipeline.from_pretrained(WEIGHTS, text_encoder_3=None, tokenizer_3=None)
    ref.set_progress_bar_config(disable=True)
    for prompt, out in zip(PROMPTS, together):
        (alone,) = omni.generate([{"prompt": prompt}], [{"seed": 7}], use_tqdm=False)
        assert out.error is None and alone.error is None, (out.error, alone.error)
        want = ref(prompt, generator=torch.Generator().manual_seed(7), output_type="np", **DEFAULT_PARAMS).images[0]
        want = (want * 255).round().astype(np.uint8)
        assert np.asarray(alone.images[0]).shape == (64, 64, 3)
        assert np.array_equal(np.asarray(alone.images[0]), want)  # one request alone: diffusers' image exactly
        # Two requests share the engine's forwards: a batch of two rounds differently from one (diffusers' own
        # pipeline, these prompts: floats up to 2.3e-6 apart), which can move a pixel across a rounding boundary,
        # one level (measured: none moved).
        assert np.abs(np.asarray(out.images[0]).astype(int) - want.astype(int)).max() <= 1


def test_demo_rejects_bad_size(omni):
    with pytest.raises(ValueError, match="height"):
        omni.generate("a red circle", [{"height": 30}], use_tqdm=False)
