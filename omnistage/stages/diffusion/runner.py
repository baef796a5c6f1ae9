"""One step boundary's tensor work (runs in a worker thread): prepare newly
admitted requests, run one batched forward with classifier-free guidance per
request, advance every request by one step, decode the ones that finished.

Row layout of the forward (the layout diffusers uses for one request):
uncond rows of every CFG request, then cond rows of every request. Requests
with guidance <= 1 carry no uncond row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omnistage.stages.diffusion.adapter import DiffusionAdapter, DiffusionJob


@dataclass
class StepResult:
    advanced: list[DiffusionJob] = field(default_factory=list)
    finished: list[tuple[DiffusionJob, dict[str, Any]]] = field(default_factory=list)
    failed: list[tuple[DiffusionJob, str]] = field(default_factory=list)


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def prepare(adapter: DiffusionAdapter, jobs: list[DiffusionJob], result: StepResult) -> list[DiffusionJob]:
    """Batched prompt encoding, then per-request timestep tables and initial latents."""
    jobs = [j for j in jobs if not j.aborted]
    if not jobs:
        return []
    try:
        adapter.encode(jobs)
    except Exception as e:
        result.failed.extend((j, _error(e)) for j in jobs)
        return []
    ready = []
    for j in jobs:
        try:
            adapter.timesteps(j)
            adapter.init_latents(j)
            ready.append(j)
        except Exception as e:  # e.g. an input image the VAE cannot encode fails only this request
            result.failed.append((j, _error(e)))
    return ready


def guide(u: torch.Tensor, c: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
    """Per-request CFG on the cond rows of CFG jobs: u + g * (c - u), rounded like diffusers in bf16/fp16."""
    idx, gains, pos = [], [], 0
    for j in jobs:
        if j.do_cfg:
            idx.extend(range(pos, pos + j.rows))
            gains.extend([j.guidance] * j.rows)
        pos += j.rows
    index = torch.tensor(idx, device=c.device)
    g = torch.tensor(gains, dtype=torch.float32, device=c.device).reshape(-1, *([1] * (c.ndim - 1)))
    cs = c.index_select(0, index)
    guided = u + ((cs - u).float() * g).to(c.dtype)
    if len(idx) == c.shape[0]:
        return guided
    return c.index_copy(0, index, guided)


@torch.no_grad()
def run_step(adapter: DiffusionAdapter, batch: list[DiffusionJob], new: list[DiffusionJob]) -> StepResult:
    result = StepResult()
    prepare(adapter, new, result)
    failed = {id(j) for j, _ in result.failed}
    jobs = [j for j in batch if not j.aborted and id(j) not in failed]
    if not jobs:
        return result
    cfg = [j for j in jobs if j.do_cfg]
    row_jobs = cfg + jobs
    x = torch.cat([j.latents for j in jobs])
    model_in = torch.cat([j.latents for j in cfg] + [x]) if cfg else x
    model_in = adapter.sampler.scale_model_input(model_in, row_jobs)
    t = torch.stack([adapter.sampler.timestep(j) for j in row_jobs for _ in range(j.rows)])
    n_uncond = sum(j.rows for j in cfg)
    if cfg and getattr(adapter, "separate_cfg_passes", False):
        # cond and uncond conditioning differ in shape or keys: one forward each (cond first, as diffusers)
        cond = {k: torch.cat([j.cond[k] for j in jobs]) for k in jobs[0].cond}
        uncond = {k: torch.cat([j.uncond[k] for j in cfg]) for k in cfg[0].uncond}
        out_c = adapter.predict(model_in[n_uncond:], t[n_uncond:], cond)
        out = torch.cat([adapter.predict(model_in[:n_uncond], t[:n_uncond], uncond), out_c])
    else:
        cond = {k: torch.cat([j.uncond[k] for j in cfg] + [j.cond[k] for j in jobs]) for k in jobs[0].cond}
        out = adapter.predict(model_in, t, cond)
    pred = guide(out[:n_uncond], out[n_uncond:], jobs) if cfg else out
    x = adapter.sampler.step(pred, x, jobs)
    for j, rows in zip(jobs, torch.split(x, [j.rows for j in jobs])):
        j.latents = rows
        j.step += 1
    result.advanced = jobs
    done = [j for j in jobs if j.step >= j.total_steps]
    latent_out = [j for j in done if j.params.output_type == "latent"]
    for j in latent_out:
        result.finished.append((j, {"latent": j.latents}))
    to_decode = [j for j in done if j.params.output_type != "latent"]
    if to_decode:
        try:
            decoded = adapter.decode(to_decode)
            pack = getattr(adapter, "pack_output", None)  # video families put frames under "video"
            result.finished.extend((j, pack(j, d) if pack else {"image": d}) for j, d in zip(to_decode, decoded))
        except Exception as e:
            result.failed.extend((j, _error(e)) for j in to_decode)
    return result
