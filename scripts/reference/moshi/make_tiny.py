"""Write a tiny Moshi (LM: temporal + depth transformer; Mimi codec) in the authors' checkpoint format, with
the authors' own classes (moshi 0.2.13) and seeded random weights.

    python make_tiny.py OUTDIR

OUTDIR gets ``config.json`` (the LM kwargs and file names, as the authors' Hugging Face repositories carry
it), ``mimi_config.json``, ``model.safetensors`` (the LM) and ``mimi.safetensors``. Shapes are toys; what
the real checkpoints have that makes serving harder is kept: 8 user + 8 model codebooks with the real delay
pattern, a sliding attention window shorter than the test sessions (so the window is exercised), per-step
depth-transformer weights, Mimi's real strides (1920 samples per 80 ms frame at 24 kHz).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import sentencepiece as spm
import torch
from moshi.models import loaders
from safetensors.torch import save_file

SEANET = {
    "channels": 1,
    "dimension": 32,
    "causal": True,
    "n_filters": 4,
    "n_residual_layers": 1,
    "activation": "ELU",
    "compress": 2,
    "dilation_base": 2,
    "disable_norm_outer_blocks": 0,
    "kernel_size": 7,
    "residual_kernel_size": 3,
    "last_kernel_size": 3,
    "norm": "none",
    "pad_mode": "constant",
    "ratios": [8, 6, 5, 4],
    "true_skip": True,
}
MIMI = {
    "sample_rate": 24000,
    "channels": 1,
    "frame_rate": 12.5,
    "seanet": SEANET,
    "quantizer": {"dimension": 16, "n_q": 8, "bins": 64, "input_dimension": 32, "output_dimension": 32},
    "transformer": {
        "d_model": 32,
        "num_heads": 2,
        "num_layers": 2,
        "causal": True,
        "layer_scale": 0.01,
        "context": 6,
        "conv_layout": True,
        "max_period": 10000,
        "gating": "none",
        "norm": "layer_norm",
        "positional_embedding": "rope",
        "dim_feedforward": 64,
        "input_dimension": 32,
        "output_dimensions": [32],
    },
}
LM = {
    "dim": 32,
    "text_card": 48,
    "existing_text_padding_id": 3,
    "n_q": 16,
    "dep_q": 8,
    "card": 64,
    "num_heads": 2,
    "num_layers": 2,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": 10,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 16,
    "depformer_dim_feedforward": 66,
    "depformer_num_heads": 2,
    "depformer_num_layers": 2,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 8,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
}


def randomize(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter and buffer drawn afresh (norm scales and codebooks included, so that none is the
    constant its class starts from), then the model's own state dict."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if not p.dtype.is_floating_point:
                continue
            if name.endswith("cluster_usage"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith("bias"):  # small: else the biases, not the input, decide the codes
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif name.endswith(("alpha", "scale")) or "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else 1  # weights [out, in, *kernel]: unit-variance outputs
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
    return {k: v.contiguous() for k, v in model.state_dict().items()}


CORPUS = """hello there how are you today
i am fine thank you and you
what would you like to talk about
the weather is nice and the sun is out
tell me a story about a cat and a dog
"""


def train_tokenizer(out: Path, vocab: int) -> None:
    """A SentencePiece model of the real one's layout (0 unk, 1 bos, 2 eos, 3 pad: Moshi's text padding), trained
    on a few lines so that the text stream decodes to words."""
    corpus = out / "corpus.txt"
    corpus.write_text(CORPUS)
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(out / "tokenizer"),
        vocab_size=vocab,
        model_type="bpe",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=3,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    corpus.unlink()
    (out / "tokenizer.vocab").unlink()


def main(outdir: str) -> None:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    mimi = loaders.get_mimi(None, MIMI, num_codebooks=8)
    save_file(randomize(mimi, 0), str(out / "mimi.safetensors"))
    lm = loaders.get_moshi_lm(None, lm_kwargs=dict(LM), dtype=torch.float32)
    save_file(randomize(lm, 1), str(out / "model.safetensors"))
    (out / "mimi_config.json").write_text(json.dumps(MIMI, indent=1) + "\n")
    train_tokenizer(out, LM["text_card"])
    config = dict(
        LM,
        # PersonaPlex's prompt frames: the real Mimi's codes of silence and of a 440 Hz tone are out of the tiny
        # card's range, so the tiny checkpoint names in-range ones (run_persona.py)
        persona_silence_codes=[5, 17, 29, 41, 53, 3, 15, 27],
        persona_sine_codes=[11, 23, 35, 47, 59, 7, 19, 31],
        moshi_name="model.safetensors",
        mimi_name="mimi.safetensors",
        mimi_config_name="mimi_config.json",
        tokenizer_name="tokenizer.model",
        model_type="moshi",
    )
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
