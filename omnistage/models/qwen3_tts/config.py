"""What the family reads from a Qwen3-TTS folder's ``config.json`` / ``generation_config.json`` without
importing torch, and the checks of the talker stage's parameters (the ``qwen-tts`` package's rules)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.info import PipelineInfo
from omnistage.pipeline import read_json
from omnistage.stages.ar.params import StageParams, TokenSampling

ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
MODEL_TYPES = ("custom_voice", "voice_design", "base")
SAMPLE_RATE = 24000
CHUNK_FRAMES = 4  # streamed pieces to the decoder: 320 ms of speech at 12.5 Hz
INITIAL_CHUNK_FRAMES = 1  # the first piece: one frame (80 ms), so the first audio leaves early
MIN_NEW_TOKENS = 2  # the package's talker rule: the end of speech cannot be among the first two tokens
SUB = "subtalker_"
# the package's hard defaults for what generation_config.json leaves out
_DEFAULTS = {
    "do_sample": True,
    "top_k": 50,
    "top_p": 1.0,
    "temperature": 0.9,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9,
    "max_new_tokens": 2048,
}
PARAM_KEYS = {
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "max_tokens",
    "min_tokens",
    "seed",
    SUB + "temperature",
    SUB + "top_k",
    SUB + "top_p",
}


def is_qwen3_tts(folder: Path) -> bool:
    return ARCHITECTURE in (read_json(folder / "config.json").get("architectures") or [])


@dataclass(frozen=True)
class Checkpoint:
    """The request-facing facts of one checkpoint."""

    model_type: str  # custom_voice | voice_design | base
    model_size: str  # "1b7" | "0b6"
    speakers: dict[str, int]  # lower-case name -> codec id
    dialects: dict[str, str | bool]  # lower-case speaker -> dialect language key (or False)
    languages: dict[str, int]  # lower-case language -> codec id (dialects included)

    @property
    def public_languages(self) -> list[str]:
        """What ``language`` may be: ``auto`` and every language that is not a dialect (the package's list)."""
        return ["auto"] + [k for k in self.languages if "dialect" not in k]

    @property
    def takes_instructions(self) -> bool:
        return self.model_type != "base" and self.model_size != "0b6"  # the 0.6B CustomVoice has no instruct


def read_checkpoint(folder: Path) -> Checkpoint:
    cfg = read_json(folder / "config.json")
    tc = cfg.get("talker_config") or {}
    kind = cfg.get("tts_model_type")
    if kind not in MODEL_TYPES:
        raise ValueError(f"{folder / 'config.json'}: tts_model_type {kind!r} is not one of {', '.join(MODEL_TYPES)}")
    if cfg.get("tokenizer_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
        raise ValueError(
            f"{folder}: tokenizer_type {cfg.get('tokenizer_type')!r} is not supported (the 12 Hz speech tokenizer is)"
        )
    return Checkpoint(
        kind,
        str(cfg.get("tts_model_size", "1b7")),
        {k.lower(): int(v) for k, v in (tc.get("spk_id") or {}).items()},
        {k.lower(): v for k, v in (tc.get("spk_is_dialect") or {}).items()},
        {k.lower(): int(v) for k, v in (tc.get("codec_language_id") or {}).items()},
    )


def folder_info(folder: Path, info: PipelineInfo) -> PipelineInfo:
    """The pipeline's info completed from a checkpoint: its preset voices, whether it clones, its languages."""
    ck = read_checkpoint(folder)
    voices = sorted(ck.speakers)
    return info.with_speech(
        voices=voices,
        default_voice=voices[0] if voices else None,
        supports_voice_cloning=ck.model_type == "base",
        needs_voice=ck.model_type == "base",  # a Base checkpoint has no speaker of its own: every request clones
        languages=ck.public_languages,
    )


@dataclass(frozen=True)
class TalkerParams:
    talker: TokenSampling
    sub: TokenSampling  # the code predictor's
    repetition_penalty: float
    max_tokens: int  # talker tokens, as the package's max_new_tokens (frames: one fewer)
    min_tokens: int  # no end of speech before this many talker tokens (at least the package's MIN_NEW_TOKENS)
    seed: int | None


def checkpoint_defaults(folder: Path) -> dict[str, Any]:
    gen = {**_DEFAULTS, **read_json(folder / "generation_config.json")}
    return {
        "temperature": float(gen["temperature"]) if gen["do_sample"] else 0.0,
        "top_k": int(gen["top_k"] or 0),
        "top_p": float(gen["top_p"]),
        "repetition_penalty": float(gen["repetition_penalty"]),
        SUB + "temperature": float(gen[SUB + "temperature"]) if gen[SUB + "dosample"] else 0.0,
        SUB + "top_k": int(gen[SUB + "top_k"] or 0),
        SUB + "top_p": float(gen[SUB + "top_p"]),
        "max_tokens": int(gen["max_new_tokens"]),
    }


def parse_params(params: Any, defaults: Mapping[str, Any]) -> TalkerParams:
    """The stage's params over the checkpoint's. ``temperature: 0`` without a ``subtalker_temperature`` is
    greedy in the code predictor too."""
    p = StageParams(params, defaults, PARAM_KEYS, "Qwen3-TTS's talker stage", SUB)
    min_tokens = int(p.number("min_tokens", 0, integer=True)) if "min_tokens" in p.merged else 0
    return TalkerParams(
        p.sampler(),
        p.sampler(SUB),
        float(p.number("repetition_penalty", 0, strict=True)),
        int(p.number("max_tokens", 1, integer=True)),
        max(MIN_NEW_TOKENS, min_tokens),
        p.seed(),
    )
