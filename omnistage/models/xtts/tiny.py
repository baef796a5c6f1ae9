"""A tiny XTTS v2 folder in the release's layout (``config.json`` + ``model.pth`` + ``vocab.json``), random
weights, seeded: what coqui-tts' ``Xtts.load_checkpoint`` loads (``scripts/reference/xtts/`` loads it there).

Toy GPT (2 layers, 64 wide, 30 audio codes + start/stop) and the release's fixed-size parts as they are (the
perceiver, the 512-channel HiFi-GAN and the ResNet speaker encoder take no size from the config). The
speaker encoder's STFT window and mel filter bank are checkpoint buffers: written as torchaudio computes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnistage.models.xtts.audio import htk_filter_bank
from omnistage.models.xtts.config import LANGUAGES, read_args
from omnistage.models.xtts.net import XttsNet

SEED = 0
CHARS = list("abcdefghijklmnopqrstuvwxyz.,!?'-:;")
MERGES = [("t", "h"), ("th", "e"), ("h", "e"), ("l", "l"), ("o", "n"), ("i", "n"), ("e", "r"), ("a", "n")]

MODEL_ARGS = {
    "gpt_batch_size": 1,
    "enable_redaction": False,
    "kv_cache": True,
    "gpt_checkpoint": None,
    "clvp_checkpoint": None,
    "decoder_checkpoint": None,
    "num_chars": 255,
    "tokenizer_file": "",
    "gpt_max_audio_tokens": 30,
    "gpt_max_text_tokens": 402,
    "gpt_max_prompt_tokens": 70,
    "gpt_layers": 2,
    "gpt_n_model_channels": 64,
    "gpt_n_heads": 4,
    "gpt_number_text_tokens": None,
    "gpt_start_text_token": None,
    "gpt_stop_text_token": None,
    "gpt_num_audio_tokens": 32,
    "gpt_start_audio_token": 30,
    "gpt_stop_audio_token": 31,
    "gpt_code_stride_len": 1024,
    "gpt_use_masking_gt_prompt_approach": True,
    "gpt_use_perceiver_resampler": True,
    "input_sample_rate": 22050,
    "output_sample_rate": 24000,
    "output_hop_length": 256,
    "decoder_input_dim": 64,
    "d_vector_dim": 512,
    "cond_d_vector_in_each_upsampling_layer": True,
    "duration_const": 102400,
}


def config() -> dict:
    return {
        "model": "xtts",
        "model_args": MODEL_ARGS,
        "audio": {"sample_rate": 22050, "output_sample_rate": 24000},
        "languages": LANGUAGES,
        "temperature": 0.75,
        "length_penalty": 1.0,
        "repetition_penalty": 5.0,
        "top_k": 50,
        "top_p": 0.85,
        "num_gpt_outputs": 1,
        "gpt_cond_len": 30,
        "gpt_cond_chunk_len": 1,  # 1 s chunks: the tests' short clips exercise the chunk mean
        "max_ref_len": 30,
        "sound_norm_refs": False,
    }


def vocab() -> dict:
    """A ``tokenizers`` BPE file as the release's vocab.json is laid out: specials first, language tags."""
    specials = ["[STOP]", "[UNK]", "[SPACE]", "[START]"] + [f"[{lang}]" for lang in LANGUAGES]
    pieces = specials + CHARS + ["".join(m) for m in MERGES]
    ids = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    added = [
        {"id": ids[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
        for s in specials
    ]
    model = {"type": "BPE", "dropout": None, "unk_token": "[UNK]", "continuing_subword_prefix": None}
    model |= {"end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}
    model |= {"vocab": ids, "merges": [list(m) for m in MERGES]}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": model,
    }


@torch.no_grad()
def _randomise(net: XttsNet) -> None:
    gen = torch.Generator().manual_seed(SEED)
    norms = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)
    scales = {f"{n}.weight" for n, m in net.named_modules() if isinstance(m, norms)}
    for name, p in net.named_parameters():
        if name.endswith("original0"):  # weight-norm gains: a unit-ish scale keeps the vocoder's signal alive
            p.copy_(0.5 + 0.5 * torch.rand(p.shape, generator=gen))
        elif name in scales or name.endswith("gamma"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    for name, b in net.named_buffers():
        if name.endswith("running_var"):
            b.copy_(0.5 + torch.rand(b.shape, generator=gen))
        elif name.endswith("running_mean"):
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    net.mel_stats.copy_(2.0 + torch.rand(net.mel_stats.shape, generator=gen))
    spec = net.hifigan_decoder.speaker_encoder.torch_spec[1]
    spec.spectrogram.window.copy_(torch.hamming_window(400))
    spec.mel_scale.fb.copy_(htk_filter_bank(257, 8000, 64, 16000, slaney_norm=False))


def build(outdir: Path) -> None:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "config.json").write_text(json.dumps(config(), indent=2) + "\n")
    (outdir / "vocab.json").write_text(json.dumps(vocab(), indent=1) + "\n")
    torch.manual_seed(SEED)
    voc = vocab()["model"]["vocab"]
    net = XttsNet(read_args(outdir), max(voc.values()) + 1)
    _randomise(net)
    state = {k: v.contiguous().clone() for k, v in net.state_dict().items()}
    torch.save({"model": state}, outdir / "model.pth")


def reference_clip(seconds: float = 2.5, rate: int = 22050):
    """The tests' reference clip: a seeded voiced-ish signal (harmonics with vibrato, plus noise), float32 mono."""
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 20 * np.sin(2 * np.pi * 3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    noise = np.random.default_rng(SEED).standard_normal(t.size)
    return (0.3 * voice + 0.02 * noise).astype(np.float32) * 0.8
