"""Starting a request's denoising schedule on the diffusion engine's sampler, as the diffusers pipelines do
before their loop (``scheduler.set_timesteps`` with the pipeline's sigmas and shift, then ``set_begin_index(0)``)."""

from __future__ import annotations

from typing import Any

import numpy as np


def linear_sigmas(pipe: Any, steps: int) -> dict[str, Any]:
    """The ``sigmas`` a flow-matching pipeline's ``__call__`` passes when the caller gives none: linear from 1 to
    1/steps, unless the scheduler makes its own flow sigmas (then none)."""
    if pipe.scheduler.config.get("use_flow_sigmas", False):
        return {}
    return {"sigmas": np.linspace(1.0, 1 / steps, steps)}


def start_schedule(adapter: Any, job: Any, steps: int, **schedule: Any) -> Any:
    """Give ``job`` its sampler state over ``steps`` on ``adapter``'s sampler and device (``schedule``: the
    scheduler's ``sigmas`` / ``mu`` / ...), begun at step 0; returns the state."""
    state = adapter.sampler.make_state(steps, device=adapter.device, **schedule)
    if hasattr(state.scheduler, "set_begin_index"):
        state.scheduler.set_begin_index(0)
    job.sampler_state = state
    return state
