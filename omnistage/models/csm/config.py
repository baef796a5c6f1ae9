"""What the family reads from a CSM folder's ``config.json`` and ``generation_config.json`` without
importing torch or transformers, and the checks of the backbone stage's parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.pipeline import read_json
from omnistage.stages.ar.params import StageParams, TokenSampling

ARCHITECTURE = "CsmForConditionalGeneration"
SAMPLE_RATE = 24000  # Mimi's rate in the release
VOICES = ["0", "1"]  # the release's conversational speakers ("[0]text", "[1]text")
DEPTH = "depth_decoder_"
# transformers' GenerationConfig defaults for what a generation_config.json leaves out
_GENERATE_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
MAX_TOKENS = 1024  # frames (80 s at 12.5 Hz) when the checkpoint sets no max_new_tokens
CHUNK_FRAMES = 4  # streamed pieces to the codec: 320 ms of speech at 12.5 Hz
INITIAL_CHUNK_FRAMES = 1  # the first piece: one frame (80 ms), so the first audio leaves early


def is_csm(folder: Path) -> bool:
    return ARCHITECTURE in (read_json(folder / "config.json").get("architectures") or [])


def _sampler(gen: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    get = {k: gen.get(prefix + k, v) for k, v in _GENERATE_DEFAULTS.items()}
    return {
        "temperature": float(get["temperature"]) if get["do_sample"] else 0.0,
        "top_k": int(get["top_k"] or 0),
        "top_p": float(get["top_p"] if get["top_p"] is not None else 1.0),
    }


@dataclass(frozen=True)
class CsmParams:
    backbone: TokenSampling
    depth: TokenSampling
    max_tokens: int  # frames, as transformers' max_new_tokens
    seed: int | None


# vLLM-style keys of the backbone (the stage takes the llm knobs: request knobs arrive here) + the depth decoder's
PARAM_KEYS = {
    "temperature",
    "top_k",
    "top_p",
    "max_tokens",
    "seed",
    DEPTH + "temperature",
    DEPTH + "top_k",
    DEPTH + "top_p",
}


def checkpoint_defaults(folder: Path) -> dict[str, Any]:
    """The checkpoint's sampling: ``generation_config.json`` (its ``depth_decoder_*`` keys for the depth
    decoder) over transformers' defaults; temperature 0 where it does not sample."""
    gen = read_json(folder / "generation_config.json")
    out = {**_sampler(gen, ""), **{DEPTH + k: v for k, v in _sampler(gen, DEPTH).items()}}
    out["max_tokens"] = int(gen.get("max_new_tokens") or MAX_TOKENS)
    return out


def parse_params(params: Any, defaults: Mapping[str, Any]) -> CsmParams:
    """The stage's params over the checkpoint's. A request that sets ``temperature: 0`` (greedy) and no
    ``depth_decoder_temperature`` is greedy in the depth decoder too."""
    p = StageParams(params, defaults, PARAM_KEYS, "CSM's backbone stage", DEPTH)
    return CsmParams(p.sampler(), p.sampler(DEPTH), int(p.number("max_tokens", 1, integer=True)), p.seed())
