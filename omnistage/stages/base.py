"""The one contract between the orchestrator and a stage engine (docs/architecture.md, "The seams").

A stage engine receives ``StageRequest``s, streams ``StageOutput`` deltas, can
be fed more input (async chunk), aborted and shut down. Engines never see the
DAG; the orchestrator never sees models. These types cross process boundaries
as they are (msgspec encodes and decodes the dataclasses, transport/messages.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from omnistage.errors import InvalidRequestError, StageFailedError, StageUnavailableError
from omnistage.speech import SpeechInput


@dataclass
class StageMetrics:
    """Per-request, per-stage numbers reported with the final output of a stage."""

    queue_time_s: float = 0.0  # submitted -> first scheduled
    run_time_s: float = 0.0  # first scheduled -> finished
    num_tokens: int = 0  # llm: generated tokens
    # llm: of its prompt, the tokens read from the prefix cache and the media placeholders' tokens (the rest is text)
    num_cached_tokens: int = 0
    num_prompt_audio_tokens: int = 0
    num_prompt_image_tokens: int = 0
    num_prompt_video_tokens: int = 0
    num_steps: int = 0  # diffusion: denoising steps run
    num_steps_reused: int = 0  # diffusion: of num_steps, those that reused cached blocks (step cache)
    peak_memory_mb: float = 0.0  # process peak RSS (CPU) or max allocated (CUDA)

    def to_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class StageError:
    """Why a stage failed one request."""

    message: str
    bad_input: bool = False  # the caller's fault (HTTP 400), not the stage's
    field: str | None = None  # with bad_input: the request field at fault
    unavailable: bool = False  # the stage's engine died and is restarting: retry later (HTTP 503)

    @classmethod
    def of(cls, e: BaseException) -> StageError:
        """An exception out of an engine's ``generate`` before work started: its own validation
        (``ValueError``, e.g. vLLM refusing a request) is bad input."""
        if isinstance(e, ValueError) and not isinstance(e, InvalidRequestError):
            return cls(str(e), bad_input=True)
        return cls.failure(e)

    @classmethod
    def failure(cls, e: BaseException) -> StageError:
        """An exception while working on a request: only a typed ``InvalidRequestError`` is the caller's."""
        if isinstance(e, InvalidRequestError):
            return cls(e.message, bad_input=True, field=e.field)
        if isinstance(e, StageUnavailableError):
            return cls(str(e), unavailable=True)
        return cls(f"{type(e).__name__}: {e}")

    def exception(self, context: str) -> Exception:
        """What the caller sees; ``context`` says where (``"stage 1 (dit): "``)."""
        if self.bad_input:
            return InvalidRequestError(self.field, self.message, context)
        if self.unavailable:
            return StageUnavailableError(f"{context}{self.message}")
        return StageFailedError(f"{context}{self.message}")


@dataclass
class StageRequest:
    request_id: str
    inputs: dict[str, Any]  # from the edge processor (or the prompt, for a source stage)
    params: Any  # DiffusionSamplingParams | merged dict | an engine's own params object
    stream_inputs: bool = False  # async chunk: more input arrives via feed()
    arrival_time: float = field(default_factory=time.monotonic)
    # the stages of this request that read this stage's output (empty: the caller alone does), so a stage
    # can skip work only a consumer needs (Qwen3-Omni's thinker: the media hidden states for the talker)
    consumers: tuple[int, ...] = ()
    # the part of this stage's output the caller asked for (e.g. "video" of a "video+audio" stage) when no other
    # stage reads it, so the stage can skip the rest (LTX-2's audio decode); None: all of it
    wanted: str | None = None
    # nobody reads this stage's deltas (no streaming edge from it, and the caller takes only the final answer):
    # a stage may skip making them (an llm stage asks vLLM for the final output alone, not one per token)
    final_only: bool = False
    # the conversation this request belongs to (a realtime session, a chat's prompt_cache_key): a stage's
    # replicas route every request of one session to the same replica, the one holding its state
    session_id: str | None = None
    # how to speak (a speech stage's voice, clip, language, ...): the prompt's or an edge's ``speech``, typed
    speech: SpeechInput | None = None


@dataclass
class StageOutput:
    request_id: str
    stage_id: int
    data: dict[str, Any]  # this update's payload delta, keyed by modality name (+ explicit aux keys)
    finished: bool
    metrics: StageMetrics | None = None
    error: StageError | None = None
    # (done, total) steps, for progress bars / job status; a diffusion stage's first, (0, 0), says it took the
    # request (checked it and queued it) before the step count is known
    progress: tuple[int, int] | None = None
    finish_reason: str | None = None  # with finished: stop | length | abort | ...
    num_tokens: int | None = None  # llm: tokens generated so far (a running count, not a delta)


@dataclass
class StageStats:
    queue_depth: int = 0  # requests waiting to be scheduled
    running: int = 0  # requests currently in a batch
    healthy: bool = True
    detail: str = ""
    replicas: int = 1  # a stage's replicas taking requests (per replica: 1)
    scaled: str = ""  # a stage whose replica count follows the load: why it last changed


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
    import torch

    # is_initialized first: a cheap flag, where is_available probes the CUDA driver on every call (a CUDA build
    # of torch on a CPU machine: ~1 ms, once per finished request)
    if torch.cuda.is_initialized() and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
