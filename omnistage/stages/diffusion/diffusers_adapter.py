"""Shared plumbing for adapters built on a diffusers pipeline's components.

The family adapter loads the diffusers pipeline from a local folder (for its
components, tokenizers, scheduler config and helpers like ``encode_prompt``)
and re-implements only the denoising loop's pieces the engine batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.samplers import SchedulerSampler, make_sampler


class DiffusersAdapter:
    pipeline_class_name: str = ""  # diffusers pipeline class, set by the family (imported lazily: diffusers is slow to import)
    default_strength = 0.6  # diffusers' img2img default

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        self.pipe = pipe
        self.dtype = dtype
        self.device = device
        self.sampler: SchedulerSampler = make_sampler(pipe.scheduler)

    @classmethod
    def load(cls, folder: str, dtype: torch.dtype, device: torch.device) -> "DiffusersAdapter":
        import diffusers

        pipe = getattr(diffusers, cls.pipeline_class_name).from_pretrained(folder, dtype=dtype)
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, dtype, device)

    # ------------------------------------------------------------- helpers for families

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor

    def default_size(self) -> int:
        return self.pipe.default_sample_size * self.pipe.vae_scale_factor

    def validate_size(self, job: DiffusionJob, what: str) -> None:
        """Fill height/width defaults; both must be multiples of ``size_multiple()`` (``what`` says why)."""
        m = self.size_multiple()
        for name in ("height", "width"):
            value = getattr(job.params, name) or self.default_size()
            if value % m:
                raise ValueError(f"{name}: {value} is not divisible by {m} ({what})")
            setattr(job, name, int(value))

    def validate_rows(self, job: DiffusionJob) -> None:
        job.rows = job.params.num_outputs_per_prompt * (len(job.images) if job.images else 1)
        if job.images:
            job.strength = job.params.strength if job.params.strength is not None else self.default_strength

    def check_steps(self, job: DiffusionJob, t_start: int) -> None:
        if job.params.num_inference_steps - t_start <= 0:
            raise ValueError(f"strength: {job.strength} leaves no denoising step out of "
                             f"num_inference_steps={job.params.num_inference_steps}; raise either")

    @staticmethod
    def repeat_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
        return t.repeat(rows, *([1] * (t.ndim - 1)))

    def to_uint8(self, images: torch.Tensor, jobs: list[DiffusionJob]) -> list[list[np.ndarray]]:
        """Decoded [-1, 1] images -> per job a list of uint8 HxWx3 arrays (diffusers' PIL rounding)."""
        arr = self.pipe.image_processor.postprocess(images, output_type="np")
        arr = (arr * 255).round().astype("uint8")
        out, pos = [], 0
        for j in jobs:
            out.append([np.ascontiguousarray(arr[i]) for i in range(pos, pos + j.rows)])
            pos += j.rows
        return out
