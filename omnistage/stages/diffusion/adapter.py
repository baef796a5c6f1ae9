"""The contract between the diffusion engine and a model family.

The engine (engine.py) owns the denoising loop and the batching; an adapter
owns everything model specific. One adapter instance serves every request of
a stage replica, so adapters keep no per-request state on ``self``: it lives
on the ``DiffusionJob`` the engine hands in (the adapter's ``job_class``, a
subclass with the family's own typed fields).

Lifecycle of one request (engine calls, in order):

    adapter = AdapterClass.load(folder, dtype, device)       # once, at start (worker thread)
    adapter.validate(job)          # fill defaults (height/width), raise InvalidRequestError naming the field
    key = adapter.batch_key(job)   # jobs with equal keys may share one forward
    adapter.encode([jobs])         # batched text encoding; sets job.cond and (CFG) job.uncond
    adapter.timesteps(job)         # sets job.sampler_state (the request's timestep table)
    adapter.init_latents(job)      # sets job.latents (noise, or noised image latents for img2img)
    loop:  x   = adapter.sampler.scale_model_input(rows, jobs)     # per-row scaling (Euler), else identity
           t   = adapter.sampler.timestep(job) for each row
           out = adapter.predict(x, t, cond)                      # one batched forward, t per row
           rows = adapter.sampler.step(guided_out, rows, jobs)    # each job's rows by its own table
           adapter.after_step(jobs)                               # phased families start a job's next phase
    adapter.decode([jobs])         # batched VAE decode -> per job a list of uint8 arrays
    adapter.pack_output(job, decoded)  # the job's output dict ({"image": decoded} unless overridden)

Conditioning is a dict of tensors whose dim 0 is the row dimension
(``job.rows`` rows per job); the engine concatenates uncond rows of all CFG
jobs followed by cond rows of all jobs (the diffusers layout for one request;
``collate`` joins the dicts) and applies per-request guidance
(``combine_guidance``, ``u + g * (c - u)`` by default) itself.

An adapter whose uncond conditioning cannot share a forward with the cond
rows (other keys or sequence length, as GLM-Image's) declares
``separate_cfg_passes = True``: the engine then runs one forward over all cond
rows and one over all uncond rows, each with its own dict.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from omnistage.params import DiffusionSamplingParams
from omnistage.stages.inprocess import Tracked

if TYPE_CHECKING:
    from omnistage.stages.diffusion.blocks import BlockLayout


@dataclass
class DiffusionJob(Tracked):
    """One request's state inside the engine (``closed``: finished, failed or aborted; steps skip it)."""

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
    step_guidance: list[float] | None = None  # per-step CFG scale (Wan2.2's low-noise expert), else params'
    # A family whose CFG rule is not diffusers' usual one (CFG when guidance_scale > 1, at that scale) sets
    # these in validate(): FLUX's true CFG (true_cfg_scale with a negative prompt; guidance_scale is an
    # embedding), Z-Image (CFG for any guidance_scale > 0).
    cfg: bool | None = None  # whether the request runs CFG (None: guidance_scale > 1)
    cfg_scale: float | None = None  # the CFG scale when it is not guidance_scale

    # filled by the engine
    key: Hashable = None
    step: int = 0  # denoising steps done
    step_cache: Any = None  # per-request step-cache state (cache_rules.JobCache), None when not caching
    lora: Any = None  # the request's LoRA adapter and scale (lora.LoraUse), None for the base model
    # the output modalities the caller wants of this stage (e.g. "video" of a "video+audio" stage), None: all
    wanted: str | None = None

    @property
    def guidance(self) -> float:
        if self.step_guidance is not None:
            return float(self.step_guidance[self.step])
        return float(self.cfg_scale if self.cfg_scale is not None else self.params.guidance_scale)

    @property
    def do_cfg(self) -> bool:
        """Whether this step runs an uncond pass. diffusers' usual rule: CFG only when the (first) scale
        exceeds 1. With a family rule (``cfg``), a step whose per-step scale is 0 runs none (Z-Image's
        ``cfg_truncation``; step 0 always keeps CFG, so the negatives are encoded)."""
        if self.cfg is None:
            return float(self.params.guidance_scale) > 1.0
        return self.cfg and (self.step_guidance is None or self.step_guidance[self.step] > 0)

    @property
    def total_steps(self) -> int:
        return self.sampler_state.num_steps if self.sampler_state is not None else self.params.num_inference_steps


def frames_of_form(job: DiffusionJob, frames: int, step: int) -> int:
    """The frame count to pass to a video pipeline: ``frames`` as asked (each family then rounds it as its own
    pipeline does), or, with ``nearest_frames`` (a count the server derived from seconds x fps), the nearest count
    of the form ``step``k+1 a temporal VAE factor of ``step`` decodes to (the higher on a tie)."""
    if not job.params.nearest_frames or (frames - 1) % step == 0:
        return frames
    lower = (frames - 1) // step * step + 1
    return lower if frames - lower < lower + step - frames else lower + step


def check_first_frame(job: DiffusionJob) -> None:
    """An image-to-video request carries exactly one input image: the first frame."""
    from omnistage.errors import InvalidRequestError

    images = job.images or []
    if len(images) != 1:
        raise InvalidRequestError(
            "multi_modal_data.image",
            "image-to-video needs the first frame as an input image"
            if not images
            else f"expected one first-frame image, got {len(images)}",
        )


class Sampler(Protocol):
    """Per-request timestep tables, batched over rows of requests at different steps.

    ``x`` holds ``job.rows`` consecutive rows per job, in the order of ``jobs``
    (samplers.py has the implementations and ``make_sampler``).
    """

    def scale_model_input(self, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor: ...

    def timestep(self, job: DiffusionJob) -> torch.Tensor: ...  # the job's current t (0-d)

    def step(self, out: torch.Tensor, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor: ...


class DiffusionAdapter(ABC):
    """Base of every diffusion adapter: the hooks the engine calls, with the optional ones defaulted."""

    # cond and uncond rows need separate forwards (see the module docstring)
    separate_cfg_passes: ClassVar[bool] = False
    # combine_guidance is called for every job, with u=None for those without CFG (a family whose guidance has
    # other terms too, e.g. LTX-2's spatio-temporal guidance; its predict may return more than the velocity)
    guides_every_job: ClassVar[bool] = False
    # the engine's per-request job: a family keeps its own per-request state in typed fields of a subclass
    # (module level, so the job pickles to the ranks of a multi-device replica)
    job_class: ClassVar[type[DiffusionJob]] = DiffusionJob
    # the PIL mode input images are converted to before ``validate`` ("RGBA": a family that reads their alpha)
    input_image_mode: ClassVar[str] = "RGB"
    sampler: Sampler

    @classmethod
    @abstractmethod
    def load(cls, folder: str, dtype: torch.dtype, device: torch.device) -> DiffusionAdapter: ...

    @abstractmethod
    def validate(self, job: DiffusionJob) -> None: ...

    @abstractmethod
    def batch_key(self, job: DiffusionJob) -> Hashable: ...

    @abstractmethod
    def encode(self, jobs: list[DiffusionJob]) -> None: ...

    @abstractmethod
    def timesteps(self, job: DiffusionJob) -> None: ...

    @abstractmethod
    def init_latents(self, job: DiffusionJob) -> None: ...

    @abstractmethod
    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor: ...

    @abstractmethod
    def decode(self, jobs: list[DiffusionJob]) -> list[list[Any]]: ...

    @classmethod
    def unsupported(cls, feature: str) -> str | None:
        """Why the family cannot run a deploy-time ``feature`` (``"lora"``), or None: checked when the deploy
        config is resolved, so such a config fails at start-up naming the family and the feature."""
        return None

    def after_step(self, jobs: list[DiffusionJob]) -> None:  # noqa: B027 (optional hook, empty by default)
        """Called after every step with the jobs it advanced (``job.step`` counts that step). A family whose
        request runs in phases (Helios: chunks of frames denoised one after another, each conditioned on the
        ones before and restarting the schedule; its pyramid: resolution stages inside a chunk) starts a job's
        next phase here: new latents, sampler state and conditioning, and a new ``job.key`` when the phase's
        latent shape differs (the scheduler then batches the job with the jobs of that key). Nothing by default."""

    def collate(self, conds: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Several jobs' conditioning dicts (in row order) as one forward's: concatenated per key, the keys of
        the last dict (a cond dict in every call). Families whose per-request tensors differ in length (Qwen-
        Image's unpadded text, masked in the forward) pad here."""
        return {k: torch.cat([c[k] for c in conds]) for k in conds[-1]}

    def combine_guidance(self, u: torch.Tensor | None, c: torch.Tensor, job: DiffusionJob) -> torch.Tensor:
        """One CFG job's guided prediction from its uncond and cond rows: ``u + g * (c - u)``, rounded like
        diffusers in bf16/fp16. Families that combine otherwise (Z-Image's ``c + g * (c - u)``) override it."""
        return u + ((c - u).float() * job.guidance).to(c.dtype)

    def pack_output(self, job: DiffusionJob, decoded: list[Any]) -> dict[str, Any]:
        """The finished job's output delta; video families put frames (and fps) under ``video``."""
        return {"image": decoded}

    def pack_latents(self, job: DiffusionJob) -> dict[str, Any]:
        """The output delta of a job asked for ``output_type="latent"``: its latent rows as they are. A family
        whose next stage needs them as its diffusers pipeline returns them (LTX-2's unpacked video and audio
        latents, for its refine pass) hands on a typed payload instead."""
        return {"latent": job.latents}

    def block_layouts(self) -> list[BlockLayout]:
        """Each denoiser's transformer blocks in call order (blocks.py), for step caching and regional
        ``torch.compile``. None by default: the stage then refuses step caching (a UNet has no single
        chain of blocks whose residual could be reused) and compiles ``denoisers()`` whole."""
        return []

    def denoisers(self) -> list[torch.nn.Module]:
        """The models ``predict`` runs (compiled whole when the family declares no block layout)."""
        return []
