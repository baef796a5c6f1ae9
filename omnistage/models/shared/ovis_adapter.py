"""Ovis-Image (Qwen3 -> OvisImageTransformer2DModel, a FLUX-style MMDiT -> VAE) for the diffusion engine.

Mirrors ``OvisImagePipeline.__call__`` step by step so that one request alone
reproduces it exactly:

- the prompt goes through the tokenizer's chat template after the pipeline's
  captioning instruction, padded to ``max_sequence_length`` + the template's
  first 28 tokens, which are dropped; padded positions are zeroed (no text mask
  reaches the transformer), so every prompt of a forward has the same length;
- latents are FLUX's packed 2x2 patches; the RoPE ids are one table per forward
  (text (0, l, l), image (0, row, column)), so the batch key fixes the output
  size and the text length;
- CFG when ``guidance_scale`` > 1, the negative prompt ("" when none) as a second
  forward, as diffusers runs it (there is no guidance embedding).
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

TEXT = "encoder_hidden_states"
MAX_SEQUENCE_LENGTH = 256  # OvisImagePipeline.__call__'s default, and the most its check_inputs allows


@dataclass
class OvisJob(DiffusionJob):
    """A request's Ovis-Image state, set in validate."""

    max_sequence_length: int = 0


class OvisImageAdapter(DiffusersAdapter):
    job_class = OvisJob
    pipeline_class_name = "OvisImagePipeline"
    separate_cfg_passes = True  # diffusers runs the negative prompt as its own forward

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.latent_channels = pipe.transformer.config.in_channels // 4
        self._txt_ids: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------- request checks

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2  # VAE factor x the 2x2 packing

    def validate(self, job: OvisJob) -> None:
        p = job.params
        refuse_images(job, "Ovis-Image is text-to-image only")
        if p.true_cfg_scale is not None:
            raise InvalidRequestError("true_cfg_scale", "Ovis-Image has no true CFG; guidance_scale > 1 is CFG")
        self.validate_size(job, f"VAE factor {self.pipe.vae_scale_factor} x 2x2 packing")
        msl = int(p.max_sequence_length or MAX_SEQUENCE_LENGTH)
        if not 1 <= msl <= MAX_SEQUENCE_LENGTH:
            raise InvalidRequestError("max_sequence_length", f"{msl} is outside 1..{MAX_SEQUENCE_LENGTH}")
        job.max_sequence_length = msl
        job.rows = p.num_outputs_per_prompt

    def batch_key(self, job: OvisJob) -> Hashable:
        # one position-id table per forward: same size and text length (every prompt is padded to it)
        return (type(self).__name__, job.height, job.width, job.max_sequence_length)

    def latent_grid(self, job: OvisJob) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor
        return 2 * (job.height // (f * 2)), 2 * (job.width // (f * 2))

    # ------------------------------------------------------------- preparation

    def embed(self, prompts: list[str], jobs: list[OvisJob]) -> dict[str, torch.Tensor]:
        embeds, _, _, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            device=self.device,
            num_images_per_prompt=1,
            max_sequence_length=jobs[0].max_sequence_length,
        )
        return {TEXT: embeds}

    def add_conditioning(self, jobs: list[OvisJob]) -> None:
        for j in jobs:
            h, w = self.latent_grid(j)
            ids = self.image_ids(j, h // 2, w // 2)
            for cond in (j.cond, j.uncond):
                if cond is not None:
                    cond["img_ids"] = ids.expand(j.rows, *ids.shape)

    def image_ids(self, job: OvisJob, h: int, w: int) -> torch.Tensor:
        """RoPE ids of the job's ``h`` x ``w`` packed output tokens (_prepare_latent_image_ids)."""
        return position_ids(h, w, 0.0, job.cond[TEXT].dtype, self.device)

    def timesteps(self, job: OvisJob) -> None:
        n = job.params.num_inference_steps
        kwargs: dict[str, Any] = {} if (sigmas := self.sigmas(n)) is None else {"sigmas": sigmas}
        h, w = self.latent_grid(job)
        kwargs["mu"] = self.dynamic_shift_mu((h // 2) * (w // 2))
        start_schedule(self, job, n, **kwargs)

    def sigmas(self, n: int) -> np.ndarray | None:
        """The schedule __call__ passes: linear sigmas, unless the scheduler makes its own flow sigmas."""
        return linear_sigmas(self.pipe, n).get("sigmas")

    def init_latents(self, job: OvisJob) -> None:
        h, w = self.latent_grid(job)
        job.latents = pack(self.noise(job, (job.rows, self.latent_channels, h, w), job.cond[TEXT].dtype))

    # ------------------------------------------------------------- the batched part

    def txt_ids(self, length: int) -> torch.Tensor:
        if length not in self._txt_ids:  # (0, l, l) per text token, as _prepare_prompt_embeds
            ids = torch.zeros(length, 3)
            ids[:, 1] = ids[:, 2] = torch.arange(length)
            self._txt_ids[length] = ids.to(device=self.device, dtype=self.text_ids_dtype())
        return self._txt_ids[length]

    def text_ids_dtype(self) -> torch.dtype:
        enc = self.pipe.text_encoder
        return enc.dtype if enc is not None else self.pipe.transformer.dtype

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        text = cond[TEXT]
        out = self.pipe.transformer(
            hidden_states=x,
            timestep=t.to(x.dtype) / 1000,
            encoder_hidden_states=text,
            txt_ids=self.txt_ids(text.shape[1]),
            img_ids=cond["img_ids"][0],
            return_dict=False,
        )[0]
        return out

    def block_layouts(self) -> list[BlockLayout]:
        tr = self.pipe.transformer  # FLUX's layout: double- then single-stream blocks, (encoder, hidden) out
        blocks = [*tr.transformer_blocks, *tr.single_transformer_blocks]
        return [BlockLayout.uniform(tr, blocks, JOINT_BLOCK, probe=adaln_zero_probe)]

    def decode(self, jobs: list[OvisJob]) -> list[list[np.ndarray]]:
        h, w = self.latent_grid(jobs[0])  # one key per decode: same size
        vae = self.pipe.vae
        latents = self.denormalize_latents(unpack(torch.cat([j.latents for j in jobs]), h, w))
        return self.to_uint8(vae.decode(latents.to(vae.dtype), return_dict=False)[0], jobs)
