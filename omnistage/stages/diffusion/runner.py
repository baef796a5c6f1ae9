"""One step boundary's tensor work (runs in a worker thread): prepare newly
admitted requests, run one batched forward with classifier-free guidance per
request, advance every request by one step, decode the ones that finished.

Row layout of the forward (the layout diffusers uses for one request):
uncond rows of every CFG request, then cond rows of every request. Requests
with guidance <= 1 carry no uncond row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from omnistage.stages.base import StageError
from omnistage.stages.diffusion.adapter import DiffusionAdapter, DiffusionJob
from omnistage.stages.diffusion.lora import forward_rows

if TYPE_CHECKING:
    from omnistage.stages.diffusion.step_cache import StepHooks


@dataclass
class StepResult:
    advanced: list[DiffusionJob] = field(default_factory=list)
    finished: list[tuple[DiffusionJob, dict[str, Any]]] = field(default_factory=list)
    failed: list[tuple[DiffusionJob, StageError]] = field(default_factory=list)


def prepare(adapter: DiffusionAdapter, jobs: list[DiffusionJob], result: StepResult) -> list[DiffusionJob]:
    """Batched prompt encoding, then per-request timestep tables and initial latents."""
    jobs = [j for j in jobs if not j.closed]
    if not jobs:
        return []
    try:
        adapter.encode(jobs)
    except Exception as e:
        result.failed.extend((j, StageError.failure(e)) for j in jobs)
        return []
    ready = []
    for j in jobs:
        try:
            adapter.timesteps(j)
            adapter.init_latents(j)
            ready.append(j)
        except Exception as e:  # e.g. an input image the VAE cannot encode fails only this request
            result.failed.append((j, StageError.failure(e)))
    return ready


def guide(adapter: DiffusionAdapter, u: torch.Tensor, c: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
    """Per-request CFG on the cond rows of CFG jobs (``adapter.combine_guidance``: u + g * (c - u) unless the
    family combines otherwise). Each job's rows are a contiguous slice and its scale a Python float, so
    nothing is copied to the device per step (a host->device copy would make the host wait for the GPU
    and lose the overlap)."""
    parts, pos, upos = [], 0, 0
    for j in jobs:
        rows = c[pos : pos + j.rows]
        if j.do_cfg:
            rows = adapter.combine_guidance(u[upos : upos + j.rows], rows, j)
            upos += j.rows
        elif adapter.guides_every_job:  # guidance terms besides CFG (LTX-2's STG): no uncond rows
            rows = adapter.combine_guidance(None, rows, j)
        parts.append(rows)
        pos += j.rows
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _predict(
    adapter: DiffusionAdapter,
    hooks: StepHooks | None,
    segments: list[tuple[DiffusionJob, str]],
    x: torch.Tensor,
    t: torch.Tensor,
    cond: dict[str, torch.Tensor],
) -> torch.Tensor:
    """One denoiser call; the LoRA layers and (with step caching) the hooks are told whose rows these are
    (``segments``: ``(job, "cond" | "uncond")`` per ``job.rows`` rows, in row order)."""
    with forward_rows(segments):
        if hooks is None:
            return adapter.predict(x, t, cond)
        with hooks.forward(segments):
            return adapter.predict(x, t, cond)


def predict_rows(
    adapter: DiffusionAdapter,
    hooks: StepHooks | None,
    uncond: list[DiffusionJob],
    cond: list[DiffusionJob],
    x: torch.Tensor,
    t: torch.Tensor,
) -> torch.Tensor:
    """The denoiser over the uncond rows of ``uncond`` followed by the cond rows of ``cond`` (``x`` and ``t``
    hold those rows, in that order): one forward, or with ``separate_cfg_passes`` one per kind."""
    n_uncond = sum(j.rows for j in uncond)
    if uncond and cond and adapter.separate_cfg_passes:
        # cond and uncond conditioning differ in shape or keys: one forward each (cond first, as diffusers)
        c = adapter.collate([j.cond for j in cond])
        u = adapter.collate([j.uncond for j in uncond])
        out_c = _predict(adapter, hooks, [(j, "cond") for j in cond], x[n_uncond:], t[n_uncond:], c)
        out_u = _predict(adapter, hooks, [(j, "uncond") for j in uncond], x[:n_uncond], t[:n_uncond], u)
        return torch.cat([out_u, out_c])
    conds = adapter.collate([j.uncond for j in uncond] + [j.cond for j in cond])
    segments = [(j, "uncond") for j in uncond] + [(j, "cond") for j in cond]
    return _predict(adapter, hooks, segments, x, t, conds)


# ``predict_rows``'s signature: how a step's rows reach the denoiser (a multi-device replica spreads them,
# stages/diffusion/parallel/rows.py)
Predict = Callable[
    [DiffusionAdapter, "StepHooks | None", list[DiffusionJob], list[DiffusionJob], torch.Tensor, torch.Tensor],
    torch.Tensor,
]


@torch.no_grad()
def run_step(
    adapter: DiffusionAdapter, batch: list[DiffusionJob], new: list[DiffusionJob], hooks: StepHooks | None = None
) -> StepResult:
    """``hooks``: the stage's step cache / compiled blocks (step_cache.py), None without acceleration."""
    # torch sets a thread's OpenMP/MKL thread count lazily, at its first parallel op; in a fresh worker
    # thread a GEMM can run before that with the library's default count and round differently (seen:
    # FLUX's first forward in a new thread off by 2e-7). Asking for the count does the per-thread setup.
    torch.get_num_threads()
    result = StepResult()
    ready = prepare(adapter, new, result)
    if hooks is not None:
        for j in ready:
            hooks.admit(j)
    failed = {id(j) for j, _ in result.failed}
    jobs = [j for j in batch if not j.closed and id(j) not in failed]
    if jobs:
        advance(adapter, jobs, result, hooks)
    return result


@torch.no_grad()
def advance(
    adapter: DiffusionAdapter,
    jobs: list[DiffusionJob],
    result: StepResult,
    hooks: StepHooks | None = None,
    predict: Predict = predict_rows,
    decode: bool = True,
) -> None:
    """One batched forward with per-request CFG, every job one step further, the finished ones decoded
    (``decode=False``: left undecoded, for the ranks of a multi-device replica other than its first)."""
    cfg = [j for j in jobs if j.do_cfg]
    row_jobs = cfg + jobs
    x = torch.cat([j.latents for j in jobs])
    model_in = torch.cat([j.latents for j in cfg] + [x]) if cfg else x
    model_in = adapter.sampler.scale_model_input(model_in, row_jobs)
    t = torch.stack([adapter.sampler.timestep(j) for j in row_jobs for _ in range(j.rows)])
    n_uncond = sum(j.rows for j in cfg)
    out = predict(adapter, hooks, cfg, jobs, model_in, t)
    pred = guide(adapter, out[:n_uncond], out[n_uncond:], jobs) if cfg or adapter.guides_every_job else out
    x = adapter.sampler.step(pred, x, jobs)
    for j, rows in zip(jobs, torch.split(x, [j.rows for j in jobs])):
        j.latents = rows
        j.step += 1
    adapter.after_step(jobs)
    result.advanced = jobs
    done = [j for j in jobs if j.step >= j.total_steps]
    if not decode:
        return
    latent_out = [j for j in done if j.params.output_type == "latent"]
    for j in latent_out:
        result.finished.append((j, adapter.pack_latents(j)))
    to_decode = [j for j in done if j.params.output_type != "latent"]
    if to_decode:
        try:
            decoded = adapter.decode(to_decode)
            result.finished.extend((j, adapter.pack_output(j, d)) for j, d in zip(to_decode, decoded))
        except Exception as e:
            result.failed.extend((j, StageError.failure(e)) for j in to_decode)
