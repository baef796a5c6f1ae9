"""demo/train_shapes.py end to end at toy scale: it writes a diffusers folder that the
SD3 pipeline loads, and on CPU the same seed and step counts give byte-identical weights (the
shipped weights were trained on a GPU, whose kernels are not bit-deterministic: demo/RESULTS.md)."""

import importlib.util

import numpy as np
import torch

from demo.components import MAX_TOKENS, T5_TOKENS, encode_text
from tests.models.demo.conftest import REPO

TOY = [
    "--device",
    "cpu",
    "--images",
    "24",
    "--vae-steps",
    "2",
    "--dit-steps",
    "3",
    "--decoder-steps",
    "2",
    "--width",
    "32",
    "--layers",
    "1",
    "--batch",
    "4",
    "--vae-batch",
    "2",
]


def _train_module():
    spec = importlib.util.spec_from_file_location("demo_train_shapes", REPO / "demo" / "train_shapes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_is_reproducible_and_loadable(tmp_path):
    from diffusers import StableDiffusion3Pipeline

    train = _train_module()
    a, b = tmp_path / "a", tmp_path / "b"
    assert train.main(["--out", str(a), *TOY]) == 0
    assert train.main(["--out", str(b), *TOY]) == 0
    torch.set_num_threads(1)  # main() sets the requested thread count; restore the tests' setting

    weights = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    assert len(weights) == 4  # transformer, vae, two text encoders
    for rel in weights:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), f"{rel} differs between two runs"

    pipe = StableDiffusion3Pipeline.from_pretrained(a, text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.text_encoder_3 is None and pipe.tokenizer.model_max_length == MAX_TOKENS
    image = pipe(
        "a red circle on the left",
        num_inference_steps=2,
        height=64,
        width=64,
        max_sequence_length=T5_TOKENS,
        output_type="np",
    ).images[0]
    assert image.shape == (64, 64, 3) and np.isfinite(image).all()


def test_encode_text_matches_the_pipeline(tmp_path):
    """Training conditions the model exactly as StableDiffusion3Pipeline.encode_prompt does."""
    from diffusers import StableDiffusion3Pipeline

    train = _train_module()
    assert train.main(["--out", str(tmp_path), *TOY]) == 0
    torch.set_num_threads(1)
    pipe = StableDiffusion3Pipeline.from_pretrained(tmp_path, text_encoder_3=None, tokenizer_3=None)
    prompts = ["a small green triangle on the right", ""]
    with torch.no_grad():
        ours, ours_pooled = encode_text(pipe.tokenizer, [pipe.text_encoder, pipe.text_encoder_2], prompts)
        ref, _, ref_pooled, _ = pipe.encode_prompt(
            prompts, None, None, do_classifier_free_guidance=False, max_sequence_length=T5_TOKENS
        )
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    torch.testing.assert_close(ours_pooled, ref_pooled, rtol=0, atol=0)
