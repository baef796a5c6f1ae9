"""What the family reads from a VoxCPM2 folder without importing torch, and the checks of the LM stage's
parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.info import PipelineInfo
from omnistage.pipeline import read_json
from omnistage.stages.ar.params import StageParams

ARCHITECTURE = "voxcpm2"  # config.json "architecture", as the release's loader reads it
SAMPLE_RATE = 48000  # the release's output rate (a folder's own: audio_vae_config.out_sample_rate)
VOICES = ["default"]  # the model's own voice for the text; ref_audio (+ ref_text) clones one
MAX_REF_AUDIO_S = 30.0
# Streamed pieces to the decoder, in patches (one LM step each: 4 latent frames, 160 ms, in the release): the
# first patch as soon as it exists, then every 4.
INITIAL_CHUNK_FRAMES = 1
CHUNK_FRAMES = 4
# The release's defaults (VoxCPM.generate): DiT timesteps, guidance, steps before the stop head may end the
# speech, and the most steps (also capped, as the release does, at 6 per token of the text + 10).
DEFAULTS = {"temperature": 1.0, "inference_timesteps": 10, "cfg_value": 2.0, "min_tokens": 2, "max_tokens": 4096}
PARAM_KEYS = set(DEFAULTS) | {"seed"}


def is_voxcpm(folder: Path) -> bool:
    return str(read_json(folder / "config.json").get("architecture", "")).lower() == ARCHITECTURE


def folder_info(folder: Path, info: PipelineInfo) -> PipelineInfo:
    """The folder's output rate (the VAE decoder's)."""
    vae = read_json(folder / "config.json").get("audio_vae_config") or {}
    return info.with_speech(sample_rate=int(vae.get("out_sample_rate") or vae.get("sample_rate") or SAMPLE_RATE))


@dataclass(frozen=True)
class VoxParams:
    temperature: float  # scales the local DiT's start noise (the release: 1.0); 0 draws none (deterministic)
    timesteps: int
    cfg_value: float
    min_tokens: int
    max_tokens: int
    seed: int | None


def parse_params(params: Any, defaults: Mapping[str, Any] = DEFAULTS) -> VoxParams:
    p = StageParams(params, defaults, PARAM_KEYS, "VoxCPM2's LM stage", "")
    return VoxParams(
        float(p.number("temperature", 0)),
        int(p.number("inference_timesteps", 1, integer=True)),
        float(p.number("cfg_value", 0)),
        int(p.number("min_tokens", 0, integer=True)),
        int(p.number("max_tokens", 1, integer=True)),
        p.seed(),
    )
