"""The Qwen-Omni talkers' sampling: the checkpoint's generation config as defaults, a request's values checked as every AR speech stage's are (stages.ar.params)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnistage.stages.ar.params import StageParams
from omnistage.stages.ar.sampling import request_generator

if TYPE_CHECKING:
    import torch

# What a talker reads of its sampling params: vLLM SamplingParams keys, and ``speaker``
TALKER_PARAM_KEYS = frozenset({"temperature", "top_k", "top_p", "repetition_penalty", "max_tokens", "seed", "speaker"})

# generation_config.json keys (transformers' names) -> SamplingParams keys
_GENERATION_KEYS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def sampling_defaults(generation: dict[str, Any], stage: str, talker_defaults: dict[str, Any]) -> dict[str, Any]:
    """``thinker`` / ``talker`` defaults: the checkpoint's generation config (its plain keys for the thinker,
    ``talker_*`` keys for the talker) over, for the talker, ``talker_defaults`` (transformers' generate() ones)."""
    base = dict(talker_defaults) if stage == "talker" else {}
    prefix = "" if stage == "thinker" else "talker_"
    for key, name in _GENERATION_KEYS.items():
        value = generation.get(prefix + key)
        if value is not None:
            base[name] = value
    if generation.get(prefix + "do_sample") is False:
        base["temperature"] = 0.0
    return base


@dataclass
class Sampling:
    """How a talker draws codebook 0 (transformers' ``generate`` knobs), with the request's generator."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def talker_sampling(params: Any, defaults: Mapping[str, Any]) -> tuple[Sampling, int, str | None]:
    """A talker's params (vLLM SamplingParams keys + ``speaker``) over ``defaults`` (the checkpoint's), each
    checked and named in the 400 it gets -> (Sampling, max_tokens, speaker)."""
    checked = StageParams(params, defaults, set(TALKER_PARAM_KEYS), "the talker", inner="")
    sampler = checked.sampler()
    penalty = float(checked.number("repetition_penalty", 0, strict=True))
    max_tokens = int(checked.number("max_tokens", 1, integer=True))
    generator = request_generator(sampler.temperature, checked.seed())
    sampling = Sampling(sampler.temperature, sampler.top_k, sampler.top_p, penalty, generator)
    return sampling, max_tokens, checked.merged.get("speaker")
