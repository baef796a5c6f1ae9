"""Stable Audio 3 family: one diffusion stage (T5Gemma + duration -> StableAudio3DiTModel -> SAME VAE), text ->
stereo audio whose latent length is the requested duration.

Two declarations of ``StableAudio3Pipeline``, told apart by the folder's scheduler, each with the defaults
``__call__`` picks for it: ``stable_audio3`` for the distilled checkpoint (ping-pong sampling,
``stochastic_sampling=True``: 8 steps) and ``stable_audio3_base`` for the base one (deterministic Euler: 100
steps). Both default to guidance 1 (no CFG), as ``__call__`` does."""

from __future__ import annotations

from omnistage.info import PipelineInfo
from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.models.stable_audio3.adapter import StableAudio3Adapter
from omnistage.models.stable_audio3.tiny import build, build_base
from omnistage.pipeline import ModelFolder, read_json


def _ping_pong(folder: ModelFolder) -> bool:
    return bool(read_json(folder.path / "scheduler" / "scheduler_config.json").get("stochastic_sampling"))


def _declare(name: str, description: str, steps: int, ping_pong: bool):
    return diffusers_pipeline(
        __file__,
        name,
        description,
        classes="StableAudio3Pipeline",
        when=lambda f: _ping_pong(f) is ping_pong,
        adapter=StableAudio3Adapter,
        output="audio",
        defaults={"num_inference_steps": steps, "guidance_scale": 1.0},  # StableAudio3Pipeline.__call__'s
        latent_output=False,
        # duration: seconds of audio (diffusers' duration; default 10 s, at most the duration embedder's max_val)
        extra_body_params={"duration": float},
        info=PipelineInfo(chat=False),  # a prompt, not chat turns: /v1/audio/generate (docs/server.md)
    )


PIPELINE = _declare(
    "stable_audio3",
    "Stable Audio 3 (distilled): T5Gemma + duration -> StableAudio3DiTModel (ping-pong) -> SAME VAE (text -> audio)",
    8,
    True,
)
BASE = _declare(
    "stable_audio3_base",
    "Stable Audio 3 (base): T5Gemma + duration -> StableAudio3DiTModel (flow-match Euler) -> SAME VAE",
    100,
    False,
)
PIPELINES = [PIPELINE, BASE]
TINY = {"stable_audio3": build, "stable_audio3_base": build_base}

__all__ = ["BASE", "PIPELINE", "PIPELINES", "StableAudio3Adapter", "TINY"]
