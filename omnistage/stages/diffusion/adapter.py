"""The contract between the diffusion engine and a model family.

The engine (engine.py) owns the denoising loop and the batching; an adapter
owns everything model specific. One adapter instance serves every request of
a stage replica, so adapters keep no per-request state on ``self``: it lives
on the ``DiffusionJob`` the engine hands in.

Lifecycle of one request (engine calls, in order):

    adapter = AdapterClass.load(folder, dtype, device)       # once, at start (worker thread)
    adapter.validate(job)          # fill defaults (height/width), raise ValueError naming the field
    key = adapter.batch_key(job)   # jobs with equal keys may share one forward
    adapter.encode([jobs])         # batched text encoding; sets job.cond and (CFG) job.uncond
    adapter.timesteps(job)         # sets job.sampler_state (the request's timestep table)
    adapter.init_latents(job)      # sets job.latents (noise, or noised image latents for img2img)
    loop:  x   = adapter.sampler.scale_model_input(rows, jobs)     # per-row scaling (Euler), else identity
           t   = adapter.sampler.timestep(job) for each row
           out = adapter.predict(x, t, cond)                      # one batched forward, t per row
           rows = adapter.sampler.step(guided_out, rows, jobs)    # each job's rows by its own table
    adapter.decode([jobs])         # batched VAE decode -> per job a list of uint8 HxWx3 arrays
    adapter.pack_output(job, decoded)  # optional: the job's output dict (default {"image": decoded}; video families)

Conditioning is a dict of tensors whose dim 0 is the row dimension
(``job.rows`` rows per job); the engine concatenates uncond rows of all CFG
jobs followed by cond rows of all jobs (the diffusers layout for one request)
and applies per-request guidance ``u + g * (c - u)`` itself.

An adapter whose uncond conditioning cannot share a forward with the cond
rows (other keys or sequence length, as GLM-Image's) sets the class attribute
``separate_cfg_passes = True``: the engine then runs one forward over all cond
rows and one over all uncond rows, each with its own dict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Hashable, Protocol

import torch

from omnistage.params import DiffusionSamplingParams


@dataclass
class DiffusionJob:
    """One request's state inside the engine."""

    request_id: str
    prompt: str
    negative_prompt: str | None
    params: DiffusionSamplingParams
    images: list[Any] | None = None  # img2img / edit inputs (PIL)
    inputs: dict[str, Any] = field(default_factory=dict)  # the stage's whole input dict (edge-provided conditioning)
    generator: torch.Generator | None = None
    arrival: float = field(default_factory=time.monotonic)

    # filled by the adapter
    height: int = 0
    width: int = 0
    strength: float | None = None
    rows: int = 1  # latent rows this request contributes (outputs per prompt x input images)
    cond: dict[str, torch.Tensor] | None = None
    uncond: dict[str, torch.Tensor] | None = None
    sampler_state: Any = None
    latents: torch.Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # adapter scratch space
    step_guidance: list[float] | None = None  # per-step CFG scale (Wan2.2's low-noise expert), else params'

    # filled by the engine
    key: Hashable = None
    step: int = 0  # denoising steps done
    first_scheduled: float | None = None
    aborted: bool = False

    @property
    def guidance(self) -> float:
        if self.step_guidance is not None:
            return float(self.step_guidance[self.step])
        return float(self.params.guidance_scale)

    @property
    def do_cfg(self) -> bool:
        # diffusers' rule: classifier-free guidance only when the (first) scale exceeds 1
        return float(self.params.guidance_scale) > 1.0

    @property
    def total_steps(self) -> int:
        return self.sampler_state.num_steps if self.sampler_state is not None else self.params.num_inference_steps


class Sampler(Protocol):
    """Per-request timestep tables, batched over rows of requests at different steps.

    ``x`` holds ``job.rows`` consecutive rows per job, in the order of ``jobs``
    (samplers.py has the implementations and ``make_sampler``).
    """

    def scale_model_input(self, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor: ...

    def timestep(self, job: DiffusionJob) -> torch.Tensor: ...  # the job's current t (0-d)

    def step(self, out: torch.Tensor, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor: ...


class DiffusionAdapter(Protocol):
    sampler: Sampler
    # optional class attribute: separate_cfg_passes = True (see the module docstring)

    @classmethod
    def load(cls, folder: str, dtype: torch.dtype, device: torch.device) -> "DiffusionAdapter": ...

    def validate(self, job: DiffusionJob) -> None: ...

    def batch_key(self, job: DiffusionJob) -> Hashable: ...

    def encode(self, jobs: list[DiffusionJob]) -> None: ...

    def timesteps(self, job: DiffusionJob) -> None: ...

    def init_latents(self, job: DiffusionJob) -> None: ...

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def decode(self, jobs: list[DiffusionJob]) -> list[list[Any]]: ...
