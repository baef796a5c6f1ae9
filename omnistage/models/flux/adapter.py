"""FLUX.1 (dev / schnell) and FLUX.1-Kontext for the diffusion engine.

Mirrors ``FluxPipeline.__call__`` and ``FluxKontextPipeline.__call__`` step by
step so that one request alone reproduces them exactly:

- latents are FLUX's packed 2x2 patches ``[rows, (h/2)*(w/2), 4C]``, drawn in
  the model dtype from the request's generator and packed as diffusers does;
- ``guidance_scale`` is not CFG but the distilled guidance embedding (one value
  per row; schnell has none); true CFG is ``true_cfg_scale`` > 1 with a
  negative prompt, run as a second forward (diffusers' cond and uncond passes
  are separate, so they are separate here too);
- the position ids FLUX's RoPE reads (``img_ids``, ``txt_ids``) are one table
  per forward, not per row: the batch key fixes the output size (and Kontext's
  input-image size) and the T5 length, so every row of a batch shares them;
- Kontext appends the input image's packed latents (VAE mode, no sampling) to
  the sequence with ids whose first coordinate is 1, and keeps only the output
  tokens of the prediction.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.flow_schedule import linear_sigmas, start_schedule
from omnistage.models.shared.input_checks import refuse_images
from omnistage.models.shared.latent_packing import pack, position_ids, unpack
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.blocks import JOINT_BLOCK, BlockLayout, adaln_zero_probe
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

MAX_SEQUENCE_LENGTH = 512  # FluxPipeline.__call__'s default and its T5 limit
DEFAULT_MAX_AREA = 1024**2  # FluxKontextPipeline.__call__'s default output area


@dataclass
class FluxJob(DiffusionJob):
    """A request's FLUX.1 state, set in validate."""

    max_sequence_length: int = 0
    image_size: tuple[int, int] | None = None  # Kontext: the (height, width) the input image is resized to


class FluxAdapter(DiffusersAdapter):
    job_class = FluxJob
    pipeline_class_name = "FluxPipeline"
    separate_cfg_passes = True  # diffusers runs true CFG's negative pass as its own forward

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.guidance_embeds = bool(pipe.transformer.config.guidance_embeds)
        self.latent_channels = pipe.transformer.config.in_channels // 4
        self._txt_ids: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    # ------------------------------------------------------------- request checks

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2  # VAE factor x the 2x2 packing

    def validate(self, job: FluxJob) -> None:
        refuse_images(job, "this FLUX.1 checkpoint is text-to-image only; edits need a FLUX.1-Kontext checkpoint")
        self.validate_common(job)
        self.validate_rows(job)

    def validate_common(self, job: FluxJob) -> None:
        p = job.params
        self.validate_size(job, f"VAE factor {self.pipe.vae_scale_factor} x 2x2 packing")
        msl = int(p.max_sequence_length or MAX_SEQUENCE_LENGTH)
        if not 1 <= msl <= MAX_SEQUENCE_LENGTH:
            raise InvalidRequestError(
                "max_sequence_length", f"{msl} is outside 1..{MAX_SEQUENCE_LENGTH} (FLUX's T5 limit)"
            )
        job.max_sequence_length = msl
        true_cfg = p.true_cfg_scale if p.true_cfg_scale is not None else 1.0
        # diffusers' do_true_cfg: a scale without a negative prompt runs without true CFG (the request is told:
        # params.stage_params warns); guidance_scale is the distilled-guidance embedding, never CFG
        job.cfg = true_cfg > 1 and job.negative_prompt is not None
        job.cfg_scale = true_cfg

    def batch_key(self, job: FluxJob) -> Hashable:
        # one img_ids / txt_ids table per forward: same size and T5 length (no text mask either)
        return ("flux", job.height, job.width, job.max_sequence_length)

    def latent_grid(self, job: FluxJob) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor
        return 2 * (job.height // (f * 2)), 2 * (job.width // (f * 2))

    # ------------------------------------------------------------- preparation

    def embed(self, prompts: list[str], jobs: list[FluxJob]) -> dict[str, torch.Tensor]:
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            device=self.device,
            num_images_per_prompt=1,
            max_sequence_length=jobs[0].max_sequence_length,
        )
        return {"encoder_hidden_states": embeds, "pooled_projections": pooled}

    def add_conditioning(self, jobs: list[FluxJob]) -> None:
        for j in jobs:
            extra = self.row_conditioning(j)
            for cond in (j.cond, j.uncond):
                if cond is not None:
                    cond.update(extra)

    def row_conditioning(self, job: FluxJob) -> dict[str, torch.Tensor]:
        """Per-row tensors both passes read: the guidance embedding's value and the image position ids
        (identical rows within a batch; ``predict`` takes the first)."""
        h, w = self.latent_grid(job)
        ids = position_ids(h // 2, w // 2, 0.0, job.cond["encoder_hidden_states"].dtype, self.device)
        out = {"img_ids": ids.expand(job.rows, *ids.shape)}
        if self.guidance_embeds:
            out["guidance"] = torch.full(
                [job.rows], float(job.params.guidance_scale), device=self.device, dtype=torch.float32
            )
        return out

    def timesteps(self, job: FluxJob) -> None:
        n = job.params.num_inference_steps
        h, w = self.latent_grid(job)
        start_schedule(self, job, n, **linear_sigmas(self.pipe, n), mu=self.dynamic_shift_mu((h // 2) * (w // 2)))

    def init_latents(self, job: FluxJob) -> None:
        h, w = self.latent_grid(job)
        dtype = job.cond["encoder_hidden_states"].dtype
        job.latents = pack(self.noise(job, (job.rows, self.latent_channels, h, w), dtype))

    # ------------------------------------------------------------- the batched part

    def txt_ids(self, length: int, dtype: torch.dtype) -> torch.Tensor:
        key = (length, dtype)
        if key not in self._txt_ids:
            self._txt_ids[key] = torch.zeros(length, 3, device=self.device, dtype=dtype)
        return self._txt_ids[key]

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        text = cond["encoder_hidden_states"]
        n = x.shape[1]
        hidden = torch.cat([x, cond["image_latents"]], dim=1) if "image_latents" in cond else x
        out = self.pipe.transformer(
            hidden_states=hidden,
            timestep=t.to(x.dtype) / 1000,
            guidance=cond.get("guidance"),
            pooled_projections=cond["pooled_projections"],
            encoder_hidden_states=text,
            txt_ids=self.txt_ids(text.shape[1], self.text_ids_dtype()),
            img_ids=cond["img_ids"][0],
            return_dict=False,
        )[0]
        return out[:, :n] if out.shape[1] != n else out

    def block_layouts(self) -> list[BlockLayout]:
        tr = self.pipe.transformer  # double- then single-stream blocks, both return (encoder, hidden) states
        blocks = [*tr.transformer_blocks, *tr.single_transformer_blocks]
        return [BlockLayout.uniform(tr, blocks, JOINT_BLOCK, probe=adaln_zero_probe)]

    def text_ids_dtype(self) -> torch.dtype:
        enc = self.pipe.text_encoder
        return enc.dtype if enc is not None else self.pipe.transformer.dtype

    def decode(self, jobs: list[FluxJob]) -> list[list[np.ndarray]]:
        h, w = self.latent_grid(jobs[0])  # one key per decode: same size
        vae = self.pipe.vae
        latents = self.denormalize_latents(unpack(torch.cat([j.latents for j in jobs]), h, w)).to(vae.device)
        return self.to_uint8(vae.decode(latents, return_dict=False)[0], jobs)


class FluxKontextAdapter(FluxAdapter):
    """FLUX.1-Kontext: one input image conditions the generation through the sequence (no img2img noise)."""

    pipeline_class_name = "FluxKontextPipeline"

    def validate(self, job: FluxJob) -> None:
        if job.images and len(job.images) != 1:
            raise InvalidRequestError(
                "multi_modal_data.image", f"FLUX.1 Kontext edits one input image, got {len(job.images)}"
            )
        if job.params.strength is not None:
            raise InvalidRequestError("strength", "not used by Kontext edits (the image conditions, it is not noised)")
        self.validate_common(job)
        extra = job.params.extra_args
        max_area = extra.get("max_area", DEFAULT_MAX_AREA)
        if isinstance(max_area, bool) or not isinstance(max_area, int) or max_area < 1:
            raise InvalidRequestError("max_area", f"expected a positive integer (pixels), got {max_area!r}")
        job.height, job.width = self.output_size(job.height, job.width, max_area)
        if job.images:
            job.image_size = self.image_size(job.images[0], extra.get("auto_resize", True))
        job.rows = job.params.num_outputs_per_prompt  # the image is conditioning, not a batch of inputs

    def output_size(self, height: int, width: int, max_area: int) -> tuple[int, int]:
        """FluxKontextPipeline's rule: the requested aspect ratio at ``max_area`` pixels, floored to the
        size multiple."""
        m = self.size_multiple()
        aspect = width / height
        w, h = round((max_area * aspect) ** 0.5), round((max_area / aspect) ** 0.5)
        w, h = w // m * m, h // m * m
        if not (h and w):
            raise InvalidRequestError(
                "max_area", f"{max_area} is too small for a {width}x{height} aspect ratio at multiples of {m}"
            )
        return h, w

    def image_size(self, image: Any, auto_resize: bool) -> tuple[int, int]:
        """(height, width) the input image is resized to: the nearest Kontext training resolution by aspect
        ratio (``auto_resize``, diffusers' default), else its own size, floored to the size multiple."""
        from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

        m = self.size_multiple()
        h, w = self.pipe.image_processor.get_default_height_width(image)
        if auto_resize:
            aspect = w / h
            _, w, h = min((abs(aspect - pw / ph), pw, ph) for pw, ph in PREFERRED_KONTEXT_RESOLUTIONS)
        h, w = h // m * m, w // m * m
        if not (h and w):
            raise InvalidRequestError("multi_modal_data.image", f"the input image is smaller than {m}x{m} pixels")
        return h, w

    def batch_key(self, job: FluxJob) -> Hashable:
        # the input image's tokens join the sequence: its (resized) size must match too
        return ("flux_kontext", job.height, job.width, job.max_sequence_length, job.image_size)

    def init_latents(self, job: FluxJob) -> None:
        if job.images:  # here, not in encode: an image the VAE cannot take fails only its own request
            self.add_image(job)
        super().init_latents(job)

    def add_image(self, job: FluxJob) -> None:
        """The input image's packed latents (VAE mode: nothing drawn from the generator) and their ids
        (first coordinate 1) join both passes' conditioning."""
        ih, iw = job.image_size
        processor = self.pipe.image_processor
        image = processor.preprocess(processor.resize(job.images[0], ih, iw), ih, iw)
        dtype = job.cond["encoder_hidden_states"].dtype
        z = self.normalize_latents(self.pipe.vae.encode(image.to(device=self.device, dtype=dtype)).latent_dist.mode())
        tokens = pack(z)
        ids = torch.cat(
            [job.cond["img_ids"][0], position_ids(z.shape[2] // 2, z.shape[3] // 2, 1.0, dtype, self.device)]
        )
        for cond in (job.cond, job.uncond):
            if cond is not None:
                cond["image_latents"] = tokens.expand(job.rows, *tokens.shape[1:])
                cond["img_ids"] = ids.expand(job.rows, *ids.shape)


FluxAdapter.variants = {"FluxKontextPipeline": FluxKontextAdapter}  # one entry point for T2I and Kontext folders
