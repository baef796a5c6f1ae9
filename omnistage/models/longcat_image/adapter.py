"""LongCat-Image (Qwen2.5-VL -> LongCatImageTransformer2DModel, a FLUX-style MMDiT -> VAE), text-to-image.

Mirrors ``LongCatImagePipeline.__call__`` step by step so that one request alone
reproduces it exactly. Its loop is Ovis-Image's shape (packed 2x2 latents, CFG
when ``guidance_scale`` > 1 as a second forward on the negative prompt, ""
when none), so the adapter is Ovis-Image's with LongCat's differences:

- the prompt (quoted parts split per character, as the pipeline's
  ``split_quotation``) is padded to 512 tokens between the pipeline's system
  template, so every prompt has 512 text tokens; the text ids are (0, l, l) and
  the image ids (1, 512 + row, 512 + column), in float32;
- the noise is drawn in float32 and cast to the text embeddings' dtype;
- CFG renorm (``enable_cfg_renorm``, on by default): the guided prediction is
  scaled per token to at most the norm of the conditional one, down to
  ``cfg_renorm_min``;
- prompt rewriting (``enable_prompt_rewrite``): the pipeline's own ``rewire_prompt``
  (a generation of up to 512 tokens by the text encoder) per prompt, alone, before
  encoding. Off unless a request asks: diffusers defaults it on, but here it would
  stall every batched request's steps for a whole LLM generation.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.ovis_adapter import TEXT, OvisImageAdapter, OvisJob

TEXT_TOKENS = 512  # LongCatImagePipeline.tokenizer_max_length: every prompt is padded to it


def pos_ids(**kwargs: Any) -> torch.Tensor:
    from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids

    return prepare_pos_ids(**kwargs)


@dataclass
class LongCatJob(OvisJob):
    """A request's LongCat-Image state, set in validate (the edit's input image forms in encode)."""

    cfg_renorm: bool = False  # rescale the guided prediction's norm to at most the cond one's
    cfg_renorm_min: float = 0.0  # ... and at least this fraction of it
    rewrite: bool = False  # the text encoder rewrites the prompt first (enable_prompt_rewrite)
    prompt_image: Any = None  # edit: the input image as the text encoder sees it (until the latents are drawn)
    vae_image: Any = None  # edit: the input image as the VAE takes it (until the latents are drawn)


class LongCatImageAdapter(OvisImageAdapter):
    job_class = LongCatJob
    pipeline_class_name = "LongCatImagePipeline"
    noise_in_float32 = True  # LongCatImagePipeline.prepare_latents draws float32 noise, then casts

    def validate(self, job: LongCatJob) -> None:
        p = job.params
        if job.images:
            raise InvalidRequestError(
                "multi_modal_data.image",
                "LongCat-Image is text-to-image only; edits need a LongCat-Image-Edit checkpoint",
            )
        self.validate_common(job)
        self.validate_size(job, f"VAE factor {self.pipe.vae_scale_factor} x 2x2 packing")
        extra = p.extra_args
        renorm, low = extra.get("enable_cfg_renorm", True), extra.get("cfg_renorm_min", 0.0)
        if not isinstance(renorm, bool):
            raise InvalidRequestError("enable_cfg_renorm", f"expected a boolean, got {renorm!r}")
        if isinstance(low, bool) or not isinstance(low, (int, float)) or not 0.0 <= low <= 1.0:
            raise InvalidRequestError("cfg_renorm_min", f"expected a number in 0..1, got {low!r}")
        rewrite = extra.get("enable_prompt_rewrite", False)
        if not isinstance(rewrite, bool):
            raise InvalidRequestError("enable_prompt_rewrite", f"expected a boolean, got {rewrite!r}")
        job.cfg_renorm, job.cfg_renorm_min, job.rewrite = renorm, float(low), rewrite

    def validate_common(self, job: LongCatJob) -> None:
        p = job.params
        if p.true_cfg_scale is not None:
            raise InvalidRequestError("true_cfg_scale", "LongCat-Image has no true CFG; guidance_scale > 1 is CFG")
        if p.max_sequence_length not in (None, TEXT_TOKENS):
            raise InvalidRequestError(
                "max_sequence_length", f"LongCat-Image pads every prompt to {TEXT_TOKENS} tokens; it cannot be changed"
            )
        job.rows = p.num_outputs_per_prompt

    def batch_key(self, job: LongCatJob) -> Hashable:
        return (type(self).__name__, job.height, job.width)  # every prompt has TEXT_TOKENS tokens

    def sigmas(self, n: int):
        import numpy as np

        return np.linspace(1.0, 1.0 / n, n)  # always passed, whatever the scheduler

    # ------------------------------------------------------------- preparation

    def encode(self, jobs: list[LongCatJob]) -> None:
        for j in jobs:
            if j.rewrite:  # alone: a padded batch would generate otherwise than diffusers' one prompt
                j.prompt = self.pipe.rewire_prompt([j.prompt], self.device)[0]
        super().encode(jobs)

    def embed(self, prompts: list[str], jobs: list[LongCatJob]) -> dict[str, torch.Tensor]:
        embeds, _ = self.pipe.encode_prompt(prompt=prompts, num_images_per_prompt=1)
        return {TEXT: embeds}

    def image_ids(self, job: LongCatJob, h: int, w: int) -> torch.Tensor:
        return pos_ids(modality_id=1, type="image", start=(TEXT_TOKENS, TEXT_TOKENS), height=h, width=w).to(self.device)

    def text_ids_dtype(self) -> torch.dtype:
        return torch.float32  # prepare_pos_ids' dtype

    def noise(self, job: LongCatJob, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if not self.noise_in_float32:
            return super().noise(job, shape, dtype)
        return super().noise(job, shape, torch.float32).to(dtype)

    # ------------------------------------------------------------- the batched part

    def combine_guidance(self, u: torch.Tensor | None, c: torch.Tensor, job: LongCatJob) -> torch.Tensor:
        guided = super().combine_guidance(u, c, job)
        if not job.cfg_renorm:
            return guided
        cond_norm = torch.norm(c, dim=-1, keepdim=True)
        noise_norm = torch.norm(guided, dim=-1, keepdim=True)
        return guided * (cond_norm / (noise_norm + 1e-8)).clamp(min=job.cfg_renorm_min, max=1.0)
