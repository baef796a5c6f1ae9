"""PixArt-Σ (T5 -> PixArtTransformer2DModel -> VAE) for the diffusion engine; Sana subclasses it.

Mirrors ``PixArtSigmaPipeline.__call__`` step by step so that one request alone
reproduces it exactly:

- T5 embeddings padded to ``max_sequence_length`` (300) with their attention
  mask, which the transformer applies in cross-attention; the negative prompt
  ("" when none) is encoded the same way, so cond and uncond rows share one
  forward (``[uncond..., cond...]``, as diffusers concatenates them);
- CFG when ``guidance_scale`` > 1 (diffusers' rule), at that scale per request;
- ``use_resolution_binning`` (diffusers' default, on): the requested size maps to
  the nearest trained aspect-ratio bin of the checkpoint's resolution; latents are
  made at the binned size (the batch key) and each decoded image is resized and
  centre-cropped back to what the request asked for;
- the transformer predicts noise and a learned variance; the variance half is
  dropped, and the request's own multistep scheduler copy takes the step.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.input_checks import refuse_images
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.blocks import BlockIO, BlockLayout
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

TEXT = "encoder_hidden_states"
MASK = "encoder_attention_mask"
MAX_SEQUENCE_LENGTH = 300  # PixArtSigmaPipeline / SanaPipeline __call__ default
TEXT_LIMIT = 512  # longer than the encoders' training length is refused rather than silently degraded

# PixArt's BasicTransformerBlock and Sana's SanaTransformerBlock: the image tokens in and out; the text, its
# mask and the timestep embedding are per-row inputs
DIT_BLOCK = BlockIO(
    returns="hidden_states", per_row=("attention_mask", "encoder_hidden_states", "encoder_attention_mask", "timestep")
)


@dataclass
class PixArtJob(DiffusionJob):
    """A request's PixArt-Sigma / Sana state, set in validate."""

    max_sequence_length: int = 0
    output_size: tuple[int, int] | None = None  # resolution binning: the requested (height, width), else None


class PixArtSigmaAdapter(DiffusersAdapter):
    job_class = PixArtJob
    pipeline_class_name = "PixArtSigmaPipeline"
    family: ClassVar[str] = "PixArt-Σ"
    clean_caption: ClassVar[bool] = True  # __call__'s default (a no-op without beautifulsoup4 and ftfy installed)

    # ------------------------------------------------------------- request checks

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * self.pipe.transformer.config.patch_size

    def default_size(self) -> int:
        return self.pipe.transformer.config.sample_size * self.pipe.vae_scale_factor  # __call__'s default

    def aspect_ratio_bins(self) -> dict[str, list[float]]:
        """The trained resolutions of this checkpoint (diffusers' table for its sample size)."""
        from diffusers.pipelines.pixart_alpha import pipeline_pixart_alpha as alpha
        from diffusers.pipelines.pixart_alpha import pipeline_pixart_sigma as sigma

        tables = {
            256: sigma.ASPECT_RATIO_2048_BIN,
            128: alpha.ASPECT_RATIO_1024_BIN,
            64: alpha.ASPECT_RATIO_512_BIN,
            32: alpha.ASPECT_RATIO_256_BIN,
        }
        return tables.get(self.pipe.transformer.config.sample_size, {})

    def binning(self, job: PixArtJob) -> bool:
        value = job.params.extra_args.get("use_resolution_binning", True)
        if not isinstance(value, bool):
            raise InvalidRequestError("use_resolution_binning", f"expected true or false, got {value!r}")
        return value

    def validate(self, job: PixArtJob) -> None:
        p = job.params
        refuse_images(job, f"{self.family} is text-to-image only")
        if p.true_cfg_scale is not None:
            raise InvalidRequestError("true_cfg_scale", f"{self.family} has no true CFG; guidance_scale > 1 is CFG")
        msl = int(p.max_sequence_length or MAX_SEQUENCE_LENGTH)
        if not 1 <= msl <= TEXT_LIMIT:
            raise InvalidRequestError("max_sequence_length", f"{msl} is outside 1..{TEXT_LIMIT}")
        job.max_sequence_length = msl
        if self.binning(job):
            bins = self.aspect_ratio_bins()
            if not bins:
                raise InvalidRequestError(
                    "use_resolution_binning",
                    "this checkpoint's sample size "
                    f"{self.pipe.transformer.config.sample_size} has no resolution bins; "
                    "send use_resolution_binning=false",
                )
            for name in ("height", "width"):
                value = getattr(p, name) or self.default_size()
                if value < 1:
                    raise InvalidRequestError(name, f"{value} is not a positive size")
                setattr(job, name, int(value))
            job.output_size = (job.height, job.width)
            job.height, job.width = self.pipe.image_processor.classify_height_width_bin(job.height, job.width, bins)
        else:
            self.validate_size(
                job, f"VAE factor {self.pipe.vae_scale_factor} x patch size {self.pipe.transformer.config.patch_size}"
            )
        job.rows = p.num_outputs_per_prompt

    def batch_key(self, job: PixArtJob) -> Hashable:
        # one latent size per forward; the text is padded to max_sequence_length, so that must match too
        return (type(self).__name__, job.height, job.width, job.max_sequence_length)

    # ------------------------------------------------------------- preparation

    def embed(self, prompts: list[str], jobs: list[PixArtJob]) -> dict[str, torch.Tensor]:
        embeds, mask, _, _ = self.pipe.encode_prompt(
            prompts,
            do_classifier_free_guidance=False,
            device=self.device,
            num_images_per_prompt=1,
            clean_caption=self.clean_caption,
            max_sequence_length=jobs[0].max_sequence_length,
        )
        return {TEXT: embeds, MASK: mask}

    def timesteps(self, job: PixArtJob) -> None:
        job.sampler_state = self.sampler.make_state(job.params.num_inference_steps, device=self.device)

    def latent_dtype(self, job: PixArtJob) -> torch.dtype:
        return job.cond[TEXT].dtype  # prepare_latents gets prompt_embeds.dtype

    def init_latents(self, job: PixArtJob) -> None:
        f = self.pipe.vae_scale_factor
        shape = (job.rows, self.pipe.transformer.config.in_channels, job.height // f, job.width // f)
        job.latents = self.noise(job, shape, self.latent_dtype(job)) * self.pipe.scheduler.init_noise_sigma

    # ------------------------------------------------------------- the batched part

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.pipe.transformer(
            x,
            encoder_hidden_states=cond[TEXT],
            encoder_attention_mask=cond[MASK],
            timestep=t,
            added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            return_dict=False,
        )[0]
        return self.drop_learned_sigma(out)

    def drop_learned_sigma(self, out: torch.Tensor) -> torch.Tensor:
        # diffusers drops it after guidance; elementwise, so before is the same
        cfg = self.pipe.transformer.config
        return out.chunk(2, dim=1)[0] if cfg.out_channels // 2 == cfg.in_channels else out

    def block_layouts(self) -> list[BlockLayout]:
        tr = self.pipe.transformer
        # TeaCache compares the timestep embedding the blocks get (adaLN-single's per-row modulation)
        return [BlockLayout.uniform(tr, tr.transformer_blocks, DIT_BLOCK, probe=lambda block, args: args["timestep"])]

    def decode(self, jobs: list[PixArtJob]) -> list[list[np.ndarray]]:
        vae = self.pipe.vae
        latents = torch.cat([j.latents for j in jobs]).to(vae.dtype)
        images = vae.decode(latents / vae.config.scaling_factor, return_dict=False)[0]
        out, pos = [], 0
        for j in jobs:
            part = images[pos : pos + j.rows]
            pos += j.rows
            if j.output_size is not None:  # back from the bin to the requested size
                h, w = j.output_size
                part = self.pipe.image_processor.resize_and_crop_tensor(part, w, h)
            out.extend(self.to_uint8(part, [j]))
        return out
