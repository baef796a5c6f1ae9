"""The one contract between the orchestrator and a stage engine (DESIGN.md).

A stage engine receives ``StageRequest``s, streams ``StageOutput`` deltas, can
be fed more input (async chunk), aborted and shut down. Engines never see the
DAG; the orchestrator never sees models.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Protocol, runtime_checkable


@dataclass
class StageMetrics:
    """Per-request, per-stage numbers reported with the final output of a stage."""

    queue_time_s: float = 0.0  # submitted -> first scheduled
    run_time_s: float = 0.0  # first scheduled -> finished
    num_tokens: int = 0  # llm: generated tokens
    num_steps: int = 0  # diffusion: denoising steps run
    peak_memory_mb: float = 0.0  # process peak RSS (CPU) or max allocated (CUDA)

    def to_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class StageRequest:
    request_id: str
    inputs: dict[str, Any]  # from the edge processor (or the prompt, for a source stage)
    params: Any  # vllm.SamplingParams | DiffusionSamplingParams | dict
    stream_inputs: bool = False  # async chunk: more input arrives via feed()
    arrival_time: float = field(default_factory=time.monotonic)


@dataclass
class StageOutput:
    request_id: str
    stage_id: int
    data: dict[str, Any]  # keyed by canonical modality name (+ explicit aux keys); a delta
    finished: bool
    metrics: StageMetrics | None = None
    error: str | None = None
    bad_input: bool = False  # the error is the caller's fault (-> 400), not the stage's
    progress: tuple[int, int] | None = None  # (done, total) steps, for progress bars / job status


@dataclass
class StageStats:
    queue_depth: int = 0  # requests waiting to be scheduled
    running: int = 0  # requests currently in a batch
    healthy: bool = True
    detail: str = ""


class StageError(RuntimeError):
    """A stage failed one request; other requests keep running."""


@runtime_checkable
class StageEngine(Protocol):
    async def start(self) -> None: ...

    def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]: ...

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    async def shutdown(self) -> None: ...

    def stats(self) -> StageStats: ...


def peak_memory_mb() -> float:
    """Peak memory of this process: CUDA max-allocated when a GPU is used, else peak RSS."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.max_memory_allocated() / 2**20
    except Exception:  # pragma: no cover - torch always importable here
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
