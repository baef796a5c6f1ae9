"""What the family reads from a Higgs Audio v2 folder without importing torch, and the checks of the LM
stage's parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from omnistage.info import PipelineInfo
from omnistage.pipeline import read_json
from omnistage.stages.ar.params import StageParams, TokenSampling

ARCHITECTURE = "HiggsAudioV2ForConditionalGeneration"
SAMPLE_RATE = 24000  # the audio tokenizer's rate in the release
# Speech without a reference clip: the model's own voice for the text; a registered voice (uploaded
# through /v1/audio/voices) or ref_audio clones one.
VOICES = ["default"]
SYSTEM_PROMPT = "Generate audio following instruction."  # the release's system turn
# transformers' GenerationConfig defaults for what a generation_config.json leaves out
_GENERATE_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
MAX_TOKENS = 1500  # LM steps (delayed frames; 60 s at 25 Hz) when the checkpoint sets no max_new_tokens
MAX_REF_AUDIO_S = 30.0  # the longest reference clip a request may clone from
CHUNK_FRAMES = 8  # streamed pieces to the decoder: 320 ms at 25 Hz
INITIAL_CHUNK_FRAMES = 2  # the first piece: 80 ms, so the first audio leaves early
# The decoder's receptive field after a frame (codec.receptive_frames of the release's DAC decoder, tiny fixture
# alike): the first piece carries it, so the first block is decoded on arrival. Only timing depends on it.
LOOKAHEAD_FRAMES = 10

PARAM_KEYS = {"temperature", "top_k", "top_p", "max_tokens", "seed", "ras_win_len", "ras_win_max_num_repeat"}


@dataclass(frozen=True)
class HiggsParams:
    sampling: TokenSampling
    max_tokens: int  # LM steps, as transformers' max_new_tokens (the first is the all-BOS frame)
    seed: int | None
    ras_win_len: int  # repetition-aware sampling (0: off): a code repeated ras_win_max_num_repeat times in
    ras_win_max_num_repeat: int  # the last ras_win_len frames is redrawn from the unwarped distribution


def checkpoint_defaults(folder: Path) -> dict[str, Any]:
    """The checkpoint's sampling: ``generation_config.json`` over transformers' defaults; temperature 0 where
    it does not sample."""
    gen = read_json(folder / "generation_config.json")
    get = {k: gen.get(k, v) for k, v in _GENERATE_DEFAULTS.items()}
    return {
        "temperature": float(get["temperature"]) if get["do_sample"] else 0.0,
        "top_k": int(get["top_k"] or 0),
        "top_p": float(get["top_p"] if get["top_p"] is not None else 1.0),
        "max_tokens": int(gen.get("max_new_tokens") or MAX_TOKENS),
        "ras_win_len": int(gen.get("ras_win_len") or 0),
        "ras_win_max_num_repeat": int(gen.get("ras_win_max_num_repeat") or 0),
    }


def parse_params(params: Any, defaults: Mapping[str, Any]) -> HiggsParams:
    p = StageParams(params, defaults, PARAM_KEYS, "Higgs Audio's LM stage", "")
    return HiggsParams(
        p.sampler(),
        int(p.number("max_tokens", 1, integer=True)),
        p.seed(),
        int(p.number("ras_win_len", 0, integer=True)),
        int(p.number("ras_win_max_num_repeat", 0, integer=True)),
    )


def folder_info(folder: Path, info: PipelineInfo) -> PipelineInfo:
    """A delay pattern over K codebooks: the all-BOS step and K - 1 delay steps make no frame (the release: K = 8)."""
    codebooks = int(read_json(folder / "config.json").get("num_codebooks", 8))
    return info.with_speech(frames=replace(info.speaks.frames, lead_tokens=codebooks))


def is_higgs_audio(folder: Path) -> bool:
    return ARCHITECTURE in (read_json(folder / "config.json").get("architectures") or [])
