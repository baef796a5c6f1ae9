"""Samplers: one denoising update for a batch whose rows belong to requests at
different step indices with different timestep tables.

Each request gets its own copy of the family's scheduler after
``set_timesteps`` (``SamplerState``): its tables are what diffusers' own
pipeline would use, bit for bit. Flow-matching Euler, Euler and DDIM then
update all rows in one vectorised expression that keeps diffusers' operation
order (so a lone request is bit-identical to ``scheduler.step``). Multistep
solvers (UniPC, DPM++, PNDM, ...) keep history inside the scheduler, so they
step each request's rows through its own scheduler copy.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.stages.diffusion.adapter import DiffusionJob


@dataclass
class SamplerState:
    scheduler: Any  # this request's own scheduler copy (tables + multistep history)
    timesteps: torch.Tensor  # the steps this request runs (after an img2img strength cut)
    begin: int  # index of timesteps[0] in the scheduler's tables
    # the scheduler's sigma table on the model's device, copied once per request: diffusers keeps it on the
    # CPU, and a per-step host->device copy of a sigma synchronises with the GPU, so the CPU could no longer
    # queue the next step while this one runs (diffusers multiplies by 0-d CPU scalars, which never copy)
    sigmas: torch.Tensor | None = None

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)


def _rows(values: list[torch.Tensor], jobs: list[DiffusionJob], ndim: int) -> torch.Tensor:
    """Per-job 0-d values -> one value per latent row, shaped to broadcast over [B, C, H, W]."""
    out = torch.stack([v for v, j in zip(values, jobs) for _ in range(j.rows)])
    return out.reshape(-1, *([1] * (ndim - 1)))


def draws_noise_in_step(scheduler: Any) -> bool:
    """Schedulers whose ``step`` takes a generator (ancestral / SDE variants draw noise there): each request's
    step must draw from its own generator, as a lone diffusers pipeline would."""
    import diffusers as d

    return isinstance(
        scheduler,
        (
            d.DDPMScheduler,
            d.DDIMScheduler,
            d.DDIMParallelScheduler,
            d.DDPMParallelScheduler,
            d.LCMScheduler,
            d.TCDScheduler,
            d.EulerDiscreteScheduler,
            d.EulerAncestralDiscreteScheduler,
            d.KDPM2AncestralDiscreteScheduler,
            d.DPMSolverMultistepScheduler,
            d.DPMSolverSinglestepScheduler,
            d.DPMSolverMultistepInverseScheduler,
            d.EDMEulerScheduler,
            d.EDMDPMSolverMultistepScheduler,
            d.SASolverScheduler,
            d.FlowMatchEulerDiscreteScheduler,
            d.FlowMatchHeunDiscreteScheduler,
            d.FlowMatchLCMScheduler,
            d.CMStochasticIterativeScheduler,
        ),
    )


class SchedulerSampler:
    """Generic, exact for any diffusers scheduler: each request steps through its own copy."""

    uses_sigmas = False  # whether step() reads SamplerState.sigmas

    def __init__(self, scheduler: Any):
        self.pristine = copy.deepcopy(scheduler)
        self._takes_generator = draws_noise_in_step(scheduler)

    @property
    def order(self) -> int:
        # not every diffusers scheduler declares an order (or set_begin_index below); diffusers' own
        # pipelines check for them the same way
        return getattr(self.pristine, "order", 1)

    def make_state(
        self, num_inference_steps: int, t_start: int = 0, device: Any = None, **set_kwargs: Any
    ) -> SamplerState:
        """``t_start`` skips the first steps (img2img strength), as diffusers' get_timesteps does."""
        sched = copy.deepcopy(self.pristine)
        sched.set_timesteps(num_inference_steps, device=device, **set_kwargs)
        begin = t_start * self.order
        if t_start and hasattr(sched, "set_begin_index"):
            sched.set_begin_index(begin)
        sigmas = None
        if self.uses_sigmas:
            sigmas = sched.sigmas if device is None else sched.sigmas.to(device)
        return SamplerState(sched, sched.timesteps[begin:], begin, sigmas)

    def timestep(self, job: DiffusionJob) -> torch.Tensor:
        return job.sampler_state.timesteps[job.step]

    def _split(self, x: torch.Tensor, jobs: list[DiffusionJob]) -> list[torch.Tensor]:
        return list(torch.split(x, [j.rows for j in jobs]))

    def scale_model_input(self, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
        if not hasattr(self.pristine, "scale_model_input"):  # flow-matching schedulers scale nothing
            return x
        parts = [
            j.sampler_state.scheduler.scale_model_input(p, self.timestep(j)) for p, j in zip(self._split(x, jobs), jobs)
        ]
        return torch.cat(parts)

    def step(self, out: torch.Tensor, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
        results = []
        for o, s, j in zip(self._split(out, jobs), self._split(x, jobs), jobs):
            kwargs: dict[str, Any] = {"return_dict": False}
            if self._takes_generator:
                kwargs["generator"] = j.generator
            results.append(j.sampler_state.scheduler.step(o, self.timestep(j), s, **kwargs)[0])
        return torch.cat(results)


class FlowMatchEulerSampler(SchedulerSampler):
    """x_next = x + (sigma_next - sigma) * v, one dt per row (FlowMatchEulerDiscreteScheduler)."""

    uses_sigmas = True

    def scale_model_input(self, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
        return x

    def step(self, out: torch.Tensor, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
        dts = []
        for j in jobs:
            sigmas, i = j.sampler_state.sigmas, j.sampler_state.begin + j.step
            dts.append(sigmas[i + 1] - sigmas[i])
        dt = _rows(dts, jobs, x.ndim).to(out.device)
        # dt rounded to the model dtype first: diffusers multiplies by a 0-d fp32 dt, which takes the
        # bf16/fp16 dtype of the model output (a [B,1,1,1] fp32 dt would promote the product to fp32)
        return (x.to(torch.float32) + dt.to(out.dtype) * out).to(out.dtype)


class EulerSampler(SchedulerSampler):
    """EulerDiscreteScheduler without churn, vectorised per row in diffusers' operation order."""

    uses_sigmas = True

    def _sigmas(self, jobs: list[DiffusionJob], ndim: int, offset: int = 0) -> torch.Tensor:
        vals = [j.sampler_state.sigmas[j.sampler_state.begin + j.step + offset] for j in jobs]
        return _rows(vals, jobs, ndim)

    def scale_model_input(self, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
        sigma = self._sigmas(jobs, x.ndim).to(x.device)
        return x / ((sigma**2 + 1) ** 0.5)

    def step(self, out: torch.Tensor, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
        pred_type = self.pristine.config.prediction_type
        sample = x.to(torch.float32)
        sigma = self._sigmas(jobs, x.ndim).to(x.device)  # no churn: diffusers' sigma_hat is sigma
        if pred_type == "epsilon":
            pred_x0 = sample - sigma * out
        elif pred_type == "v_prediction":
            pred_x0 = out * (-sigma / (sigma**2 + 1) ** 0.5) + (sample / (sigma**2 + 1))
        else:
            pred_x0 = out
        derivative = (sample - pred_x0) / sigma
        dt = self._sigmas(jobs, x.ndim, 1).to(x.device) - sigma
        return (sample + derivative * dt).to(out.dtype)


class DDIMSampler(SchedulerSampler):
    """DDIMScheduler with eta = 0, vectorised per row (coefficients computed per request as diffusers does)."""

    def scale_model_input(self, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
        return x

    def _coefficients(self, job: DiffusionJob) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = job.sampler_state.scheduler
        t = self.timestep(job)
        prev_t = t - s.config.num_train_timesteps // s.num_inference_steps
        a_t = s.alphas_cumprod[t]
        a_prev = s.alphas_cumprod[prev_t] if prev_t >= 0 else s.final_alpha_cumprod
        return a_t, a_prev, (1 - a_prev) ** 0.5  # eta = 0: no variance term

    def step(self, out: torch.Tensor, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
        cfg = self.pristine.config
        coeffs = [self._coefficients(j) for j in jobs]
        a_t = _rows([c[0] for c in coeffs], jobs, x.ndim).to(x.device)
        a_prev = _rows([c[1] for c in coeffs], jobs, x.ndim).to(x.device)
        dir_coef = _rows([c[2] for c in coeffs], jobs, x.ndim).to(x.device)
        b_t = 1 - a_t
        if cfg.prediction_type == "epsilon":
            pred_x0 = (x - b_t ** (0.5) * out) / a_t ** (0.5)
            pred_eps = out
        elif cfg.prediction_type == "sample":
            pred_x0 = out
            pred_eps = (x - a_t ** (0.5) * pred_x0) / b_t ** (0.5)
        else:  # v_prediction
            pred_x0 = (a_t**0.5) * x - (b_t**0.5) * out
            pred_eps = (a_t**0.5) * out + (b_t**0.5) * x
        if cfg.clip_sample:
            pred_x0 = pred_x0.clamp(-cfg.clip_sample_range, cfg.clip_sample_range)
        return a_prev ** (0.5) * pred_x0 + dir_coef * pred_eps


def make_sampler(scheduler: Any) -> SchedulerSampler:
    """The vectorised sampler for the schedulers that have one, else the exact per-request fallback.
    Exact types, not subclasses: a subclass may change ``step``."""
    import diffusers as d

    cfg = scheduler.config
    if type(scheduler) is d.FlowMatchEulerDiscreteScheduler and not cfg.get("stochastic_sampling", False):
        return FlowMatchEulerSampler(scheduler)
    if type(scheduler) is d.EulerDiscreteScheduler and cfg.get("prediction_type") in (
        "epsilon",
        "v_prediction",
        "sample",
    ):
        return EulerSampler(scheduler)
    if type(scheduler) is d.DDIMScheduler and not cfg.get("thresholding", False):
        return DDIMSampler(scheduler)
    return SchedulerSampler(scheduler)
