"""The step cache's per-request state and its rules: when a request computes a step and when it reuses the
residual of an earlier one (step_cache.py runs them inside the batched forward).

The rules (``rel`` = mean|p - p_prev| / mean|p_prev| over the request's cond rows):

- first_block: compute while ``step < warmup_steps``, when there is no earlier probe, after
  ``max_consecutive_cached`` reused steps, or when ``rel > threshold``; ``p_prev`` is the probe of
  the last computed step.
- teacache: compute at step 0, while ``step < warmup_steps``, at the last step, after
  ``max_consecutive_cached`` reused steps, or once ``acc += poly(rel)`` reaches ``threshold`` (then
  ``acc = 0``); ``p_prev`` is the previous step's probe; ``poly`` is numpy's ``poly1d(coefficients)``
  (the identity by default: TeaCache's fitted coefficients are per model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.stages.diffusion.adapter import DiffusionJob

# ------------------------------------------------------------------ per-request state


@dataclass
class ModelState:
    """One request's cache for one denoiser model (Wan2.2's experts each have their own)."""

    prev: torch.Tensor | None = None  # the probe the next one is compared with
    acc: float = 0.0  # TeaCache's accumulated distance
    streak: int = 0  # consecutive reused steps
    residual: dict[str, torch.Tensor] = field(default_factory=dict)  # kind -> its rows' image-token residual


@dataclass
class JobCache:
    models: dict[int, ModelState] = field(default_factory=dict)
    step: int = -1  # the step whose decision ``compute`` holds
    compute: bool = True
    computed: int = 0
    reused: int = 0


def steps_reused(job: DiffusionJob) -> int:
    return job.step_cache.reused if isinstance(job.step_cache, JobCache) else 0


# ------------------------------------------------------------------ rules


class CacheRule:
    probe_before_first_block = False

    def __init__(self, threshold: float, warmup_steps: int = 0, max_consecutive_cached: int | None = None):
        self.threshold = float(threshold)
        self.warmup_steps = int(warmup_steps)
        self.max_consecutive = max_consecutive_cached

    def _forced(self, st: ModelState, job: DiffusionJob, rel: float | None) -> bool:
        return (
            rel is None
            or job.step < self.warmup_steps
            or (self.max_consecutive is not None and st.streak >= self.max_consecutive)
        )

    def decide(self, st: ModelState, job: DiffusionJob, rel: float | None) -> bool:
        """True: the request computes this step."""
        raise NotImplementedError

    def keeps_probe(self, compute: bool) -> bool:
        """Whether this step's probe becomes the one the next step is compared with."""
        return compute


class FirstBlockRule(CacheRule):
    def decide(self, st: ModelState, job: DiffusionJob, rel: float | None) -> bool:
        return self._forced(st, job, rel) or rel > self.threshold


class TeaCacheRule(CacheRule):
    probe_before_first_block = True

    def __init__(
        self,
        threshold: float,
        warmup_steps: int = 0,
        max_consecutive_cached: int | None = None,
        coefficients: Sequence[float] | None = None,
    ):
        super().__init__(threshold, warmup_steps, max_consecutive_cached)
        self.rescale = np.poly1d(list(coefficients) if coefficients else [1.0, 0.0])

    def decide(self, st: ModelState, job: DiffusionJob, rel: float | None) -> bool:
        if self._forced(st, job, rel) or job.step == job.total_steps - 1:
            st.acc = 0.0
            return True
        st.acc += float(self.rescale(rel))
        if st.acc < self.threshold:
            return False
        st.acc = 0.0
        return True

    def keeps_probe(self, compute: bool) -> bool:
        return True


def make_rule(cfg: Any) -> CacheRule:
    """The rule of an ``acceleration.cache`` config (config/stage_sections.py ``CacheConfig``)."""
    common = dict(
        threshold=cfg.threshold, warmup_steps=cfg.warmup_steps, max_consecutive_cached=cfg.max_consecutive_cached
    )
    if cfg.method == "first_block":
        return FirstBlockRule(**common)
    if cfg.method == "teacache":
        return TeaCacheRule(**common, coefficients=cfg.coefficients)
    raise ValueError(f"cache.method: unknown method {cfg.method!r}")
