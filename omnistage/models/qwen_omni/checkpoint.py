"""Loading parts of a Qwen3-Omni checkpoint: a stage needs its own modules only.

Each module is built from its part of the config and given its weights read by name
from the safetensors files (``talker.*``, ``code2wav.*``, the thinker's embedding
table), so a stage never loads the 30B thinker it does not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from omnistage.models.shared.checkpoint import read_tensors


def load_config(folder: str | Path):
    from transformers import Qwen3OmniMoeConfig

    config = Qwen3OmniMoeConfig.from_pretrained(str(folder))
    with_thinker_audio_window(config)
    return config


def with_thinker_audio_window(config) -> None:
    """transformers' talker ``get_rope_index`` reads ``config.audio_config.n_window`` for a prompt with audio and
    an image or video, and the talker's config has no ``audio_config`` (transformers 5.19: ``generate(...,
    return_audio=True)`` raises AttributeError on such prompts). The window is the thinker's audio encoder's:
    give the talker's config that one (on this config object only)."""
    if "audio_config" not in config.talker_config.to_dict():
        config.talker_config.audio_config = config.thinker_config.audio_config


def load_talker(folder: str | Path, config, dtype: torch.dtype, device: str):
    from transformers import Qwen3OmniMoeTalkerForConditionalGeneration

    # sdpa: the talker engine passes boolean 4-D masks (padded batches of per-request caches)
    config.talker_config._attn_implementation = "sdpa"
    model = Qwen3OmniMoeTalkerForConditionalGeneration(config.talker_config)
    model.load_state_dict(merge_experts(read_tensors(folder, "talker.")), strict=True)
    return model.to(device=device, dtype=dtype).eval()


def merge_experts(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint MoE layout (``mlp.experts.{e}.{gate,up,down}_proj.weight``) -> transformers 5's fused
    expert tensors (``mlp.experts.gate_up_proj`` [E, 2I, H], gate rows first; ``mlp.experts.down_proj``
    [E, H, I]). transformers converts these when it loads the whole model; loading the talker alone it
    does not (its conversion table has no entry for the talker's model type)."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    pattern = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    for name, tensor in weights.items():
        m = pattern.match(name)
        if m is None:
            out[name] = tensor
        else:
            experts.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = tensor
    for prefix, by_index in experts.items():
        order = [by_index[e] for e in sorted(by_index)]
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([p["gate"], p["up"]], dim=0) for p in order])
        out[f"{prefix}.down_proj"] = torch.stack([p["down"] for p in order])
    return out


def load_code2wav(folder: str | Path, config, dtype: torch.dtype, device: str):
    from transformers import Qwen3OmniMoeCode2Wav

    model = Qwen3OmniMoeCode2Wav(config.code2wav_config)
    model.load_state_dict(read_tensors(folder, "code2wav."), strict=True)
    return model.to(device=device, dtype=dtype).eval()


def load_thinker_embedding(folder: str | Path, dtype: torch.dtype, device: str) -> torch.nn.Embedding:
    """The thinker's token embedding table: the talker's text input is ``text_projection`` of it."""
    weight = read_tensors(folder, "thinker.model.embed_tokens.")["weight"]
    return torch.nn.Embedding.from_pretrained(weight.to(dtype), freeze=True).to(device)
