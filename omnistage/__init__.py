"""omnistage: serve omni-modality generative pipelines offline and over an OpenAI-compatible API."""

from omnistage.engine.async_omni import AsyncOmni
from omnistage.engine.omni import Omni
from omnistage.engine.request import InvalidRequestError, StageFailedError
from omnistage.modality import OutputModality
from omnistage.outputs import OmniRequestOutput
from omnistage.params import DiffusionSamplingParams
from omnistage.pipeline import Edge, Pipeline, StageSpec, register_pipeline

__all__ = [
    "AsyncOmni",
    "DiffusionSamplingParams",
    "Edge",
    "InvalidRequestError",
    "Omni",
    "OmniRequestOutput",
    "OutputModality",
    "Pipeline",
    "StageFailedError",
    "StageSpec",
    "register_pipeline",
]
