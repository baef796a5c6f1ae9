"""FLUX.2 [klein] (Qwen3 text encoder) and [dev] (Mistral3, ``Flux2Adapter`` below) for the diffusion engine,
text-to-image and reference-image edits.

Mirrors ``Flux2KleinPipeline.__call__`` step by step so that one request alone
reproduces it exactly:

- the prompt (as a one-turn chat, thinking off) padded to ``max_sequence_length``
  tokens; the text encoder's hidden states of three layers stacked per token;
- latents are 2x2 patches folded into channels (``[rows, (h/2)*(w/2), 4C]``),
  drawn from the request's generator; RoPE reads 4-axis position ids (T, H, W, L)
  that are one table per forward, so the batch key fixes the output size, the text
  length and every reference image's size;
- CFG when ``guidance_scale`` > 1 on a non-distilled checkpoint (diffusers' rule),
  as a second forward on the negative prompt ("" when none, as diffusers encodes);
  a distilled checkpoint (``is_distilled``) never runs it;
- reference images (``/v1/images/edits``, one or more): each resized to at most
  1024x1024 px, floored to the size multiple and centre-cropped, VAE-encoded (mode)
  and batch-norm-normalised; their tokens join the sequence with T = 10, 20, ...
  and only the output tokens of the prediction are kept;
- decoding undoes the VAE's batch norm and the 2x2 folding before the VAE.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.flow_schedule import linear_sigmas, start_schedule
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.blocks import BlockIO, BlockLayout
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

TEXT = "encoder_hidden_states"
MAX_SEQUENCE_LENGTH = 512  # Flux2KleinPipeline.__call__'s default and its tokenizer limit
# The blocks take the modulation computed once per forward (one row per batch row) as tensors they split inside.
DOUBLE_BLOCK = BlockIO(returns=("encoder_hidden_states", "hidden_states"), per_row=("temb_mod_img", "temb_mod_txt"))
# the single-stream blocks take and return cat([text, image]) along the tokens (the forward joins them)
SINGLE_BLOCK = BlockIO(returns="hidden_states", per_row=("temb_mod",), joins=("encoder_hidden_states", "hidden_states"))
REFERENCE_AREA = 1024 * 1024  # larger reference images are resized down to this many pixels
MAX_REFERENCE_IMAGES = 10  # BFL's documented limit for FLUX.2


@dataclass
class Flux2Job(DiffusionJob):
    """A request's FLUX.2 state, set in validate."""

    max_sequence_length: int = 0
    reference_sizes: list[tuple[int, int]] = field(default_factory=list)  # (height, width) of each input image


class Flux2KleinAdapter(DiffusersAdapter):
    job_class = Flux2Job
    pipeline_class_name = "Flux2KleinPipeline"
    separate_cfg_passes = True  # diffusers runs the negative prompt as its own forward

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.latent_channels = pipe.transformer.config.in_channels // 4
        self.distilled = bool(pipe.config.get("is_distilled", False))
        self._txt_ids: dict[tuple[int, torch.device], torch.Tensor] = {}

    # ------------------------------------------------------------- request checks

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2  # VAE factor x the 2x2 folding

    def validate(self, job: Flux2Job) -> None:
        p = job.params
        if p.strength is not None:
            raise InvalidRequestError(
                "strength", "not used by FLUX.2 (reference images condition, they are not noised)"
            )
        if p.true_cfg_scale is not None:
            raise InvalidRequestError("true_cfg_scale", "FLUX.2 [klein] has no true CFG; guidance_scale > 1 is CFG")
        msl = int(p.max_sequence_length or MAX_SEQUENCE_LENGTH)
        if not 1 <= msl <= MAX_SEQUENCE_LENGTH:
            raise InvalidRequestError("max_sequence_length", f"{msl} is outside 1..{MAX_SEQUENCE_LENGTH}")
        job.max_sequence_length = msl
        job.reference_sizes = self.reference_sizes(job)
        # diffusers' default size is the first reference image's (else default_sample_size x VAE factor)
        first = job.reference_sizes[0] if job.images else (self.default_size(),) * 2
        m = self.size_multiple()
        for name, default in (("height", first[0]), ("width", first[1])):
            value = getattr(p, name) or default
            if value % m:
                raise InvalidRequestError(
                    name, f"{value} is not divisible by {m} (VAE factor {self.pipe.vae_scale_factor} x 2x2 folding)"
                )
            setattr(job, name, int(value))
        job.cfg = float(p.guidance_scale) > 1 and not self.distilled  # diffusers' do_classifier_free_guidance
        job.rows = p.num_outputs_per_prompt  # reference images condition; they are not a batch of inputs

    def reference_sizes(self, job: Flux2Job) -> list[tuple[int, int]]:
        """(height, width) each reference image is cropped to, as __call__ prepares them."""
        if not job.images:
            return []
        if len(job.images) > MAX_REFERENCE_IMAGES:
            raise InvalidRequestError(
                "multi_modal_data.image",
                f"{len(job.images)} reference images; FLUX.2 takes at most {MAX_REFERENCE_IMAGES}",
            )
        processor, m = self.pipe.image_processor, self.size_multiple()
        sizes = []
        for i, image in enumerate(job.images):
            try:
                processor.check_image_input(image)
            except ValueError as e:
                raise InvalidRequestError("multi_modal_data.image", f"image {i}: {e}") from None
            w, h = image.size
            if w * h > REFERENCE_AREA:
                scale = (REFERENCE_AREA / (w * h)) ** 0.5  # _resize_to_target_area's sizes
                w, h = int(w * scale), int(h * scale)
            sizes.append((h // m * m, w // m * m))
        return sizes

    def batch_key(self, job: Flux2Job) -> Hashable:
        # one position-id table per forward: output size, text length and reference sizes must all match
        return (
            type(self).__name__,
            job.height,
            job.width,
            job.max_sequence_length,
            tuple(job.reference_sizes),
        )

    def latent_grid(self, job: Flux2Job) -> tuple[int, int]:
        """The folded latent grid (tokens per column and row)."""
        f = self.size_multiple()
        return job.height // f, job.width // f

    # ------------------------------------------------------------- preparation

    def embed(self, prompts: list[str], jobs: list[Flux2Job]) -> dict[str, torch.Tensor]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts,
            device=self.device,
            num_images_per_prompt=1,
            max_sequence_length=jobs[0].max_sequence_length,
        )
        return {TEXT: embeds}

    def add_conditioning(self, jobs: list[Flux2Job]) -> None:
        for j in jobs:
            h, w = self.latent_grid(j)
            ids = self.pipe._prepare_latent_ids(torch.empty(1, 1, h, w)).to(self.device)[0]
            for cond in (j.cond, j.uncond):
                if cond is not None:
                    cond["img_ids"] = ids.expand(j.rows, *ids.shape)

    def timesteps(self, job: Flux2Job) -> None:
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        n = job.params.num_inference_steps
        h, w = self.latent_grid(job)
        start_schedule(self, job, n, mu=compute_empirical_mu(h * w, n), **linear_sigmas(self.pipe, n))

    def init_latents(self, job: Flux2Job) -> None:
        h, w = self.latent_grid(job)
        noise = self.noise(job, (job.rows, self.latent_channels * 4, h, w), job.cond[TEXT].dtype)
        job.latents = self.pipe._pack_latents(noise)
        if job.images:  # here, not in encode: an image the VAE cannot take fails only its own request
            self.add_references(job)

    def add_references(self, job: Flux2Job) -> None:
        """The reference images' packed latents and their ids (T = 10, 20, ...) join both passes."""
        processor = self.pipe.image_processor
        images = [
            processor.preprocess(im, height=h, width=w, resize_mode="crop")
            for im, (h, w) in zip(job.images, job.reference_sizes)
        ]
        tokens, ids = self.pipe.prepare_image_latents(
            images=images, batch_size=job.rows, generator=job.generator, device=self.device, dtype=self.pipe.vae.dtype
        )
        for cond in (job.cond, job.uncond):
            if cond is not None:
                cond["image_latents"] = tokens
                cond["img_ids"] = torch.cat([cond["img_ids"], ids.to(cond["img_ids"].dtype)], dim=1)

    # ------------------------------------------------------------- the batched part

    def txt_ids(self, length: int) -> torch.Tensor:
        key = (length, self.device)
        if key not in self._txt_ids:  # (0, 0, 0, l) per text token, as _prepare_text_ids
            self._txt_ids[key] = self.pipe._prepare_text_ids(torch.empty(1, length, 1))[0].to(self.device)
        return self._txt_ids[key]

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        n = x.shape[1]
        tr = self.pipe.transformer
        hidden = torch.cat([x, cond["image_latents"]], dim=1) if "image_latents" in cond else x
        out = tr(
            hidden_states=hidden.to(tr.dtype),
            timestep=t.to(x.dtype) / 1000,
            guidance=cond.get("guidance"),
            encoder_hidden_states=cond[TEXT],
            txt_ids=self.txt_ids(cond[TEXT].shape[1]),
            img_ids=cond["img_ids"][0],
            return_dict=False,
        )[0]
        return out[:, :n]

    def block_layouts(self) -> list[BlockLayout]:
        tr = self.pipe.transformer
        blocks = [
            *((b, DOUBLE_BLOCK) for b in tr.transformer_blocks),
            *((b, SINGLE_BLOCK) for b in tr.single_transformer_blocks),
        ]
        return [BlockLayout(tr, tuple(blocks), probe=modulated_input)] if tr.transformer_blocks else []

    def decode(self, jobs: list[Flux2Job]) -> list[list[np.ndarray]]:
        vae = self.pipe.vae
        latents = self.unfold(torch.cat([j.latents for j in jobs]), jobs[0])
        return self.to_uint8(vae.decode(latents.to(vae.dtype), return_dict=False)[0], jobs)

    def unfold(self, tokens: torch.Tensor, job: Flux2Job) -> torch.Tensor:
        """Packed tokens -> VAE latents: the grid, the batch norm undone, the 2x2 folding undone."""
        h, w = self.latent_grid(job)
        x = tokens.view(tokens.shape[0], h, w, tokens.shape[2]).permute(0, 3, 1, 2)  # row-major ids
        vae = self.pipe.vae
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(x.device, x.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(x.device, x.dtype)
        return self.pipe._unpatchify_latents(x * std + mean)


def modulated_input(block: Any, args: dict[str, Any]) -> torch.Tensor:
    """TeaCache's probe: the first double-stream block's timestep-modulated image input, as that block makes it."""
    from diffusers.models.transformers.transformer_flux2 import Flux2Modulation

    (shift, scale, _), _ = Flux2Modulation.split(args["temb_mod_img"], 2)
    return (1 + scale) * block.norm1(args["hidden_states"]) + shift


class Flux2Adapter(Flux2KleinAdapter):
    """FLUX.2 [dev] (``Flux2Pipeline``): the [klein] loop with a Mistral3 text encoder (the pipeline's system
    turn before every prompt, hidden states 10, 20 and 30) and no CFG: ``guidance_scale`` is the distilled
    guidance embedding, one value per row, so requests of any guidance share a forward."""

    pipeline_class_name = "Flux2Pipeline"
    separate_cfg_passes = False  # there is no uncond pass

    def validate(self, job: Flux2Job) -> None:
        if job.negative_prompt is not None:
            raise InvalidRequestError(
                "negative_prompt",
                "FLUX.2 [dev] runs no CFG (guidance_scale is its "
                "distilled guidance embedding), so it has no negative prompt",
            )
        if job.params.true_cfg_scale is not None:
            raise InvalidRequestError(
                "true_cfg_scale", "FLUX.2 [dev] has no true CFG; guidance_scale is its distilled guidance embedding"
            )
        super().validate(job)
        job.cfg = False

    def add_conditioning(self, jobs: list[Flux2Job]) -> None:
        super().add_conditioning(jobs)
        for j in jobs:  # float32 whatever the model dtype, as __call__ builds it
            j.cond["guidance"] = torch.full(
                [j.rows], float(j.params.guidance_scale), device=self.device, dtype=torch.float32
            )
