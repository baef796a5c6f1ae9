"""Loading parts of a Qwen2.5-Omni checkpoint: a stage builds its own modules from its part of the config and
reads their weights by name (``talker.*``, ``token2wav.*``, the thinker's embedding table), so no stage loads
the thinker it does not run."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.models.shared.checkpoint import read_tensors  # the same safetensors layout (by prefix)


def load_config(folder: str | Path):
    from transformers import Qwen2_5OmniConfig

    return Qwen2_5OmniConfig.from_pretrained(str(folder))


def load_talker(folder: str | Path, config, dtype: torch.dtype, device: str):
    from transformers import Qwen2_5OmniTalkerForConditionalGeneration

    # sdpa: the talker engine passes boolean 4-D masks (padded batches of per-request caches)
    config.talker_config._attn_implementation = "sdpa"
    model = Qwen2_5OmniTalkerForConditionalGeneration(config.talker_config)
    model.load_state_dict(read_tensors(folder, "talker."), strict=True)
    return model.to(device=device, dtype=dtype).eval()


def load_token2wav(folder: str | Path, config, device: str):
    """DiT + BigVGAN, float32 always (transformers' generate() runs token2wav in float32 too)."""
    from transformers import Qwen2_5OmniToken2WavModel

    config.token2wav_config._attn_implementation = "sdpa"
    model = Qwen2_5OmniToken2WavModel(config.token2wav_config)
    model.load_state_dict(read_tensors(folder, "token2wav."), strict=True)
    return model.to(device=device, dtype=torch.float32).eval()


def load_thinker_embedding(folder: str | Path, dtype: torch.dtype, device: str) -> torch.nn.Embedding:
    weight = read_tensors(folder, "thinker.model.embed_tokens.")["weight"]
    return torch.nn.Embedding.from_pretrained(weight.to(dtype), freeze=True).to(device)
