"""What every adapter built on a diffusers pipeline's components shares.

The family adapter loads the diffusers pipeline from a local folder (for its
components, tokenizers, scheduler config and helpers like ``encode_prompt``)
and re-implements only the pieces of the denoising loop the engine batches.
This base holds the parts that are the same across families, each written
the way diffusers' pipelines compute them (so outputs stay bit-identical):
loading, size checks, batched prompt encoding with "" for a missing negative,
image-to-image latents, VAE latent (de)normalisation, the dynamic shift of
flow-matching schedules, and uint8 conversion of decoded images.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.pipeline import ModelFolder
from omnistage.stages.diffusion.adapter import DiffusionAdapter, DiffusionJob
from omnistage.stages.diffusion.samplers import SchedulerSampler, make_sampler


class DiffusersAdapter(DiffusionAdapter):
    # diffusers pipeline class (looked up lazily: importing diffusers costs seconds)
    pipeline_class_name: ClassVar[str] = ""
    # components this stage never uses (loaded as None), e.g. an AR model another stage runs
    skip_components: ClassVar[tuple[str, ...]] = ()
    # the family's adapters for its other diffusers pipeline classes (model_index.json ``_class_name``),
    # so one StageSpec serves them all (e.g. SD 1.5 and SDXL); assigned once those classes exist
    variants: ClassVar[Mapping[str, type[DiffusersAdapter]]] = {}
    default_strength: ClassVar[float] = 0.6  # diffusers' img2img default

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        self.pipe = pipe
        self.dtype = dtype
        self.device = device
        self.sampler: SchedulerSampler = make_sampler(pipe.scheduler)

    @classmethod
    def load(cls, folder: str, dtype: torch.dtype, device: torch.device, quantization: Any = None) -> DiffusersAdapter:
        """The family's entry point: a folder of another of the family's pipeline classes (``variants``)
        gets that class's adapter. ``quantization``: the stage's deploy ``quantization:`` (quantization.py)."""
        variant = cls.variants.get(ModelFolder(Path(folder)).diffusers_class)
        if variant is not None and variant is not cls:
            return variant.load(folder, dtype, device, quantization)
        import diffusers

        kwargs = cls.pipeline_kwargs(folder)
        if quantization is not None:
            from omnistage.stages.diffusion.quantization import load_arguments

            kwargs.update(load_arguments(quantization, folder, dtype, "quantization"))
        pipe = getattr(diffusers, cls.pipeline_class_name).from_pretrained(folder, dtype=dtype, **kwargs)
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, dtype, device)

    @classmethod
    def unsupported(cls, feature: str) -> str | None:
        if feature == "lora":  # per-request adapters are read with the pipeline class's own lora_state_dict
            import diffusers

            pipeline_class = getattr(diffusers, cls.pipeline_class_name, None) if cls.pipeline_class_name else None
            if pipeline_class is not None and not hasattr(pipeline_class, "lora_state_dict"):
                return f"diffusers has no LoRA loader for {cls.pipeline_class_name}"
        return None

    @classmethod
    def pipeline_kwargs(cls, folder: str) -> dict[str, Any]:
        """Extra ``from_pretrained`` arguments: by default the components this stage never uses, as None."""
        return {c: None for c in cls.skip_components}

    def denoisers(self) -> list[torch.nn.Module]:
        return [
            m
            for m in (getattr(self.pipe, n, None) for n in ("transformer", "transformer_2", "unet"))
            if isinstance(m, torch.nn.Module)
        ]

    # ------------------------------------------------------------- request checks

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
                raise InvalidRequestError(name, f"{value} is not divisible by {m} ({what})")
            setattr(job, name, int(value))

    def validate_rows(self, job: DiffusionJob) -> None:
        job.rows = job.params.num_outputs_per_prompt * (len(job.images) if job.images else 1)
        if job.images:
            job.strength = job.params.strength if job.params.strength is not None else self.default_strength

    def check_steps(self, job: DiffusionJob, t_start: int) -> None:
        if job.params.num_inference_steps - t_start <= 0:
            raise InvalidRequestError(
                "strength",
                f"{job.strength} leaves no denoising step out of "
                f"num_inference_steps={job.params.num_inference_steps}; raise either",
            )

    # ------------------------------------------------------------- prompt encoding

    def embed(self, prompts: list[str], jobs: list[DiffusionJob]) -> dict[str, torch.Tensor]:
        """One batched text-encoder call: conditioning tensors with one row per prompt. ``jobs`` are the
        requests the prompts belong to (for per-batch settings such as ``max_sequence_length``)."""
        raise NotImplementedError(f"{type(self).__name__} encodes prompts itself")

    def embed_negatives(self, jobs: list[DiffusionJob]) -> dict[str, torch.Tensor]:
        # diffusers encodes the negatives in their own call, with "" standing in for a missing one
        return self.embed([j.negative_prompt or "" for j in jobs], jobs)

    def encode(self, jobs: list[DiffusionJob]) -> None:
        cond = self.embed([j.prompt for j in jobs], jobs)
        for i, j in enumerate(jobs):
            j.cond = {k: self.repeat_rows(v[i : i + 1], j.rows) for k, v in cond.items()}
        cfg = [j for j in jobs if j.do_cfg]
        if cfg:
            uncond = self.embed_negatives(cfg)
            for i, j in enumerate(cfg):
                j.uncond = {k: self.repeat_rows(v[i : i + 1], j.rows) for k, v in uncond.items()}
        self.add_conditioning(jobs)

    def add_conditioning(self, jobs: list[DiffusionJob]) -> None:
        """Per-row conditioning beyond the text embeddings (e.g. SDXL's time ids); none by default."""

    @staticmethod
    def repeat_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
        return t.repeat(rows, *([1] * (t.ndim - 1)))

    # ------------------------------------------------------------- latents

    def noise(self, job: DiffusionJob, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        from diffusers.utils.torch_utils import randn_tensor

        return randn_tensor(shape, generator=job.generator, device=self.device, dtype=dtype)

    def image_latents(self, job: DiffusionJob, dtype: torch.dtype) -> torch.Tensor:
        """img2img: the input images' VAE latents in model space, repeated to the job's rows (diffusers'
        ``prepare_latents``: sampled with the request's generator, then normalised)."""
        image = self.pipe.image_processor.preprocess(job.images, height=job.height, width=job.width)
        image = image.to(device=self.device, dtype=dtype)
        init = self.normalize_latents(self.pipe.vae.encode(image).latent_dist.sample(job.generator))
        if job.rows > init.shape[0]:
            init = torch.cat([init] * (job.rows // init.shape[0]), dim=0)
        return init

    def normalize_latents(self, z: torch.Tensor) -> torch.Tensor:
        """VAE latents -> the denoiser's latent space: ``(z - shift) * scale`` (SD3 / Flux / Z-Image; SD 1.5
        has no shift). Families whose VAE has per-channel statistics override both directions."""
        cfg = self.pipe.vae.config
        shift = cfg.get("shift_factor")
        return ((z - shift) * cfg.scaling_factor) if shift is not None else z * cfg.scaling_factor

    def denormalize_latents(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.pipe.vae.config
        shift = cfg.get("shift_factor")
        return (x / cfg.scaling_factor + shift) if shift is not None else x / cfg.scaling_factor

    def channel_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's per-channel ``latents_mean`` / ``latents_std``, shaped to broadcast over ``like``."""
        cfg = self.pipe.vae.config
        shape = (1, len(cfg.latents_mean)) + (1,) * (like.ndim - 2)
        mean = torch.tensor(cfg.latents_mean).view(shape).to(like.device, like.dtype)
        std = torch.tensor(cfg.latents_std).view(shape).to(like.device, like.dtype)
        return mean, std

    # ------------------------------------------------------------- schedules

    def dynamic_shift_mu(self, image_seq_len: int) -> float:
        """The flow-matching shift exponent for this many image tokens (the ``calculate_shift`` rule of
        diffusers' SD3 / Flux / Qwen-Image pipelines: linear between the scheduler's two anchors)."""
        cfg = self.pipe.scheduler.config
        base_len, max_len = cfg.get("base_image_seq_len", 256), cfg.get("max_image_seq_len", 4096)
        base_shift, max_shift = cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15)
        m = (max_shift - base_shift) / (max_len - base_len)
        b = base_shift - m * base_len
        return image_seq_len * m + b

    # ------------------------------------------------------------- output

    def to_uint8(self, images: torch.Tensor, jobs: list[DiffusionJob]) -> list[list[np.ndarray]]:
        """Decoded [-1, 1] images -> per job a list of uint8 HxWx3 arrays (diffusers' PIL rounding)."""
        arr = self.pipe.image_processor.postprocess(images, output_type="np")
        arr = (arr * 255).round().astype("uint8")
        out, pos = [], 0
        for j in jobs:
            out.append([np.ascontiguousarray(arr[i]) for i in range(pos, pos + j.rows)])
            pos += j.rows
        return out

    def decode(self, jobs: list[DiffusionJob]) -> list[list[Any]]:
        vae = self.pipe.vae
        latents = self.denormalize_latents(torch.cat([j.latents for j in jobs]).to(vae.dtype))
        return self.to_uint8(vae.decode(latents, return_dict=False)[0], jobs)
