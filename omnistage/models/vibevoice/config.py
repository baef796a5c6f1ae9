"""What the family reads from a VibeVoice folder without importing torch, the stage's parameters, and the
multi-speaker script format (``Speaker 1: ...`` lines)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.pipeline import read_json
from omnistage.stages.ar.params import StageParams

ARCHITECTURE = "VibeVoiceForConditionalGeneration"
SAMPLE_RATE = 24000  # the acoustic tokenizer's rate in the releases
MAX_TOKENS = 2048  # LM steps (one latent frame each, 7.5 Hz in the releases) when the checkpoint sets none
# the keys a request may set: tokens are always argmax (transformers' VibeVoice ignores do_sample), so only the
# length, the seed of the diffusion head's noise, its guidance and its number of denoising steps
PARAM_KEYS = {"max_tokens", "seed", "temperature", "guidance_scale", "num_diffusion_steps"}
_LINE = re.compile(r"^\s*speaker\s*(\d+)\s*:\s*(.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class VibeVoiceParams:
    max_tokens: int
    seed: int | None
    guidance_scale: float
    num_diffusion_steps: int


def checkpoint_defaults(folder: Path) -> dict[str, Any]:
    gen = read_json(folder / "generation_config.json")
    return {
        "max_tokens": int(gen.get("max_new_tokens") or MAX_TOKENS),
        "guidance_scale": float(gen.get("guidance_scale") or 1.0),
        "num_diffusion_steps": int(gen.get("num_diffusion_steps") or 10),
    }


def parse_params(params: Any, defaults: Mapping[str, Any]) -> VibeVoiceParams:
    p = StageParams(params, defaults, PARAM_KEYS, "VibeVoice's stage", "")
    temperature = p.merged.get("temperature")
    if temperature not in (None, 0, 0.0):  # say so rather than ignore it, as transformers does with a warning
        raise InvalidRequestError(
            "temperature",
            "VibeVoice picks its tokens greedily; only temperature 0 is taken "
            "(the seed sets the diffusion head's noise)",
        )
    max_tokens = int(p.number("max_tokens", 1, integer=True))
    steps = int(p.number("num_diffusion_steps", 1, integer=True))
    return VibeVoiceParams(max_tokens, p.seed(), float(p.number("guidance_scale", 0.0)), steps)


def script_turns(text: Any) -> list[tuple[str, str]]:
    """A script -> [(speaker id, line)]: ``Speaker N: ...`` lines start turns (other lines continue the turn
    before); text with no speaker line is one turn of speaker 1."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequestError("input", "expected non-empty text (a script of 'Speaker N: ...' lines)")
    turns: list[list[str]] = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            turns.append([m.group(1), m.group(2).strip()])
        elif line.strip():
            if not turns:
                turns.append(["1", ""])
            turns[-1][1] = f"{turns[-1][1]} {line.strip()}".strip()
    out = [(s, t) for s, t in turns if t]
    if not out:
        raise InvalidRequestError("input", "the script has no text to speak")
    return out


def is_vibevoice(folder: Path) -> bool:
    return ARCHITECTURE in (read_json(folder / "config.json").get("architectures") or [])
