"""Moshi's checkpoint layout (the authors' Hugging Face repositories: ``config.json`` holding the LM's kwargs and
the names of the weight files) and its constants; imports no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

SAMPLE_RATE = 24000
FRAME_RATE = 12.5
FRAME_SAMPLES = 1920  # one 80 ms frame at 24 kHz
CHUNK_PERIOD_MS = 80
DEFAULT_LM_WEIGHTS = "model.safetensors"
DEFAULT_MIMI_WEIGHTS = "tokenizer-e351c8d8-checkpoint125.safetensors"  # the authors' Moshi release
DEFAULT_TOKENIZER = "tokenizer_spm_32k_3.model"
TEXT_PADDING = (0, 3)  # the text stream's padding tokens: no text for them (as moshi.server)


@dataclass(frozen=True)
class LMConfig:
    dim: int
    text_card: int
    n_q: int
    dep_q: int
    card: int
    num_heads: int
    num_layers: int
    hidden_scale: float
    context: int
    max_period: float
    norm: str
    depformer_dim: int
    depformer_dim_feedforward: int
    depformer_num_heads: int
    depformer_num_layers: int
    delays: tuple[int, ...]
    existing_text_padding_id: int = 3
    depformer_context: int | None = None  # the depth transformer's KV ring (None: its dep_q steps)
    # PersonaPlex's prompt frames (persona.py): the model's codes of silence and the user's of a tone; the released
    # Mimi's by default, a checkpoint whose Mimi has another codebook names its own
    persona_silence_codes: tuple[int, ...] = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
    persona_sine_codes: tuple[int, ...] = (430, 1268, 381, 1611, 1095, 1495, 56, 472)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LMConfig:
        unsupported = {
            "gating": raw.get("gating", "silu") != "silu" or raw.get("depformer_gating", "silu") != "silu",
            "positional_embedding": raw.get("positional_embedding", "rope") != "rope",
            "depformer_pos_emb": raw.get("depformer_pos_emb", "none") != "none",
            "depformer_multi_linear": not raw.get("depformer_multi_linear", False),
            "depformer_weights_per_step": not raw.get("depformer_weights_per_step", False),
            "layer_scale": raw.get("layer_scale") is not None or raw.get("depformer_layer_scale") is not None,
            "conditioners": bool(raw.get("conditioners")) or raw.get("fuser") is not None,
        }
        bad = [k for k, v in unsupported.items() if v]
        if bad:
            raise ValueError(f"moshi: this checkpoint's {', '.join(bad)} is not the Moshi layout served here")
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in names}
        values["delays"] = tuple(raw["delays"])
        for key in ("persona_silence_codes", "persona_sine_codes"):
            if key in values:
                values[key] = tuple(values[key])
        values.setdefault("depformer_dim_feedforward", int(raw.get("hidden_scale", 4.125) * raw["depformer_dim"]))
        return cls(**values)


@dataclass(frozen=True)
class Checkpoint:
    lm: LMConfig
    lm_weights: Path
    mimi_weights: Path
    mimi: dict[str, Any]
    tokenizer: Path | None  # the text stream's SentencePiece model (None: the folder has none)


def is_moshi_config(raw: dict[str, Any]) -> bool:
    """An authors' Moshi ``config.json``: the LM kwargs with a depth transformer and a delay pattern."""
    return (
        raw.get("model_type", "moshi") == "moshi" and "dep_q" in raw and "delays" in raw and "architectures" not in raw
    )


def read_checkpoint(folder: str | Path) -> Checkpoint:
    folder = Path(folder)
    raw = json.loads((folder / "config.json").read_text())
    mimi_name = raw.get("mimi_config_name")
    if not mimi_name:
        raise ValueError("moshi: config.json names no mimi_config_name (Mimi's layout)")
    return Checkpoint(
        lm=LMConfig.from_dict(raw),
        lm_weights=folder / raw.get("moshi_name", DEFAULT_LM_WEIGHTS),
        mimi_weights=folder / raw.get("mimi_name", DEFAULT_MIMI_WEIGHTS),
        mimi=json.loads((folder / mimi_name).read_text()),
        tokenizer=tokenizer if (tokenizer := folder / raw.get("tokenizer_name", DEFAULT_TOKENIZER)).is_file() else None,
    )
