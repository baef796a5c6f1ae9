"""omnistage: serve omni-modality generative pipelines offline and over an OpenAI-compatible API.

Public names are imported lazily (PEP 562): ``import omnistage.bench`` or the
CLI's ``--help`` should not pay for importing torch and diffusers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omnistage.stages.lifetime import die_with_spawning_parent

# First, in a process an omnistage process spawned (a stage child, vLLM's engine core and its workers: spawn
# imports the parent's main module, which imports omnistage): it ends with its parent from here on.
die_with_spawning_parent()

_EXPORTS = {
    "AsyncOmni": "omnistage.engine.async_omni",
    "Omni": "omnistage.engine.omni",
    "InvalidRequestError": "omnistage.errors",
    "StageFailedError": "omnistage.errors",
    "StageUnavailableError": "omnistage.errors",
    "RequestKnobs": "omnistage.params",
    "OutputModality": "omnistage.modality",
    "OmniRequestOutput": "omnistage.outputs",
    "DiffusionSamplingParams": "omnistage.params",
    "LLMSamplingParams": "omnistage.llm_params",
    "Edge": "omnistage.pipeline",
    "Pipeline": "omnistage.pipeline",
    "StageSpec": "omnistage.pipeline",
    "register_pipeline": "omnistage.pipeline",
    "SpeechInput": "omnistage.speech",
    "SpeechTurn": "omnistage.speech",
    "Transcription": "omnistage.speech",
}

__all__ = sorted(_EXPORTS)

# The engines resolve a model folder against the pipeline registry; the package is the one place that fills it
# with the built-in families (cheap: each family's __init__ declares, loads nothing), so the engine layer never
# imports the models above it.
_NEED_FAMILIES = {"AsyncOmni", "Omni"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'omnistage' has no attribute {name!r}")
    if name in _NEED_FAMILIES:
        importlib.import_module("omnistage.models")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # for type checkers and IDEs
    from omnistage.engine.async_omni import AsyncOmni
    from omnistage.engine.omni import Omni
    from omnistage.errors import (
        InvalidRequestError,
        StageFailedError,
        StageUnavailableError,
    )
    from omnistage.llm_params import LLMSamplingParams
    from omnistage.modality import OutputModality
    from omnistage.outputs import OmniRequestOutput
    from omnistage.params import DiffusionSamplingParams, RequestKnobs
    from omnistage.pipeline import Edge, Pipeline, StageSpec, register_pipeline
    from omnistage.speech import SpeechInput, SpeechTurn, Transcription
