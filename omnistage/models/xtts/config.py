"""What the family reads from an XTTS v2 folder (the release's ``config.json`` + ``model.pth`` + ``vocab.json``)
without importing torch, and the checks of the GPT stage's parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.pipeline import read_json
from omnistage.stages.ar.params import StageParams, TokenSampling

MODEL_NAME = "xtts"  # config.json "model"
SAMPLE_RATE = 24000  # the HiFi-GAN decoder's output rate
# XTTS has no preset voice in its weights (the release's speakers_xtts.pth is an optional extra file): every
# request clones, from ref_audio or a voice registered through /v1/audio/voices.
VOICES = ["default"]
MAX_REF_AUDIO_S = 30.0  # the release's max_ref_len: what it reads of a reference clip
STREAM_CHUNK_CODES = 20  # inference_stream's stream_chunk_size: codes per streamed decode
OVERLAP_SAMPLES = 1024  # inference_stream's overlap_wav_len: the cross-fade between streamed pieces
LANGUAGES = ["en", "es", "fr", "de", "it", "pt", "pl", "tr", "ru", "nl", "cs", "ar", "zh-cn", "hu", "ko", "ja", "hi"]
PARAM_KEYS = {"temperature", "top_k", "top_p", "max_tokens", "seed", "repetition_penalty"}


@dataclass(frozen=True)
class XttsArgs:
    """The checkpoint's ``model_args`` (what the model's shapes and special tokens are) and cloning settings."""

    dim: int
    layers: int
    heads: int
    num_audio_tokens: int
    start_audio_token: int
    stop_audio_token: int
    max_audio_tokens: int
    max_text_tokens: int
    max_prompt_tokens: int
    code_stride_len: int
    d_vector_dim: int
    gpt_cond_len: float
    gpt_cond_chunk_len: float
    max_ref_len: float
    sound_norm_refs: bool
    languages: tuple[str, ...]

    @property
    def max_new_codes(self) -> int:
        """The most codes one request generates (the release's ``max_gen_mel_tokens``)."""
        return self.max_audio_tokens - 3


@dataclass(frozen=True)
class XttsParams:
    sampling: TokenSampling
    repetition_penalty: float
    max_tokens: int
    seed: int | None


def read_args(folder: Path) -> XttsArgs:
    cfg = read_json(Path(folder) / "config.json")
    a = cfg.get("model_args") or {}
    return XttsArgs(
        dim=int(a["gpt_n_model_channels"]),
        layers=int(a["gpt_layers"]),
        heads=int(a["gpt_n_heads"]),
        num_audio_tokens=int(a["gpt_num_audio_tokens"]),
        start_audio_token=int(a["gpt_start_audio_token"]),
        stop_audio_token=int(a["gpt_stop_audio_token"]),
        max_audio_tokens=int(a["gpt_max_audio_tokens"]),
        max_text_tokens=int(a["gpt_max_text_tokens"]),
        max_prompt_tokens=int(a["gpt_max_prompt_tokens"]),
        code_stride_len=int(a["gpt_code_stride_len"]),
        d_vector_dim=int(a["d_vector_dim"]),
        gpt_cond_len=float(cfg.get("gpt_cond_len", 30)),
        gpt_cond_chunk_len=float(cfg.get("gpt_cond_chunk_len", 4)),
        max_ref_len=float(cfg.get("max_ref_len", 30)),
        sound_norm_refs=bool(cfg.get("sound_norm_refs", False)),
        languages=tuple(cfg.get("languages") or LANGUAGES),
    )


def checkpoint_defaults(folder: Path) -> dict[str, Any]:
    """The release's inference settings from ``config.json`` (what ``Xtts.synthesize`` passes)."""
    cfg = read_json(Path(folder) / "config.json")
    return {
        "temperature": float(cfg.get("temperature", 0.75)),
        "top_k": int(cfg.get("top_k", 50)),
        "top_p": float(cfg.get("top_p", 0.85)),
        "repetition_penalty": float(cfg.get("repetition_penalty", 5.0)),
        "max_tokens": read_args(folder).max_new_codes,
    }


def parse_params(params: Any, defaults: Mapping[str, Any], max_codes: int) -> XttsParams:
    p = StageParams(params, defaults, PARAM_KEYS, "XTTS's GPT stage", "")
    max_tokens = int(p.number("max_tokens", 1, integer=True))
    if max_tokens > max_codes:
        raise InvalidRequestError(
            "max_tokens", f"must be <= {max_codes} (the model's longest output), got {max_tokens}"
        )
    return XttsParams(p.sampler(), float(p.number("repetition_penalty", 0, strict=True)), max_tokens, p.seed())


def text_language(language: Any, languages: tuple[str, ...]) -> str:
    """The release's language code for a request's ``language`` (``zh`` is ``zh-cn``; a region is dropped
    elsewhere, as the release drops it); an unknown one is a 400 naming ``language``."""
    if language is None:
        return "en"
    if not isinstance(language, str):
        raise InvalidRequestError("language", f"expected a string, got {language!r}")
    code = language.strip().lower()
    code = "zh-cn" if code in ("zh", "zh-cn") else code.split("-")[0]
    if code not in languages:
        raise InvalidRequestError("language", f"{language!r} is not one of XTTS's languages ({', '.join(languages)})")
    return code


def is_xtts(folder: Path) -> bool:
    return read_json(Path(folder) / "config.json").get("model") == MODEL_NAME
