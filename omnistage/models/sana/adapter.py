"""Sana (Gemma-2 -> SanaTransformer2DModel, linear attention -> DC-AE) for the diffusion engine.

``SanaPipeline`` was derived from PixArt-Σ's and its loop is the same shape, so
the adapter is PixArt-Σ's (masked text padded to ``max_sequence_length``, CFG
when ``guidance_scale`` > 1, resolution binning, a per-request multistep
scheduler) with Sana's differences, each as ``SanaPipeline.__call__`` has it:

- the prompt (not the negative) is prefixed with ``complex_human_instruction``
  (the pipeline's default instruction) and then cut back to ``max_sequence_length``
  tokens (the first token and the last ``max_sequence_length - 1``);
- latents are float32 whatever the model dtype; the transformer gets them cast,
  with the timestep times ``timestep_scale``, and its prediction goes back to float32;
- the DC-AE has a spatial factor of 32 and no shift; the default size is 1024x1024.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch

from omnistage.models.shared.pixart_adapter import MASK, TEXT, PixArtSigmaAdapter
from omnistage.stages.diffusion.adapter import DiffusionJob

DEFAULT_SIZE = 1024  # SanaPipeline.__call__'s height and width


class SanaAdapter(PixArtSigmaAdapter):
    pipeline_class_name = "SanaPipeline"
    family: ClassVar[str] = "Sana"
    clean_caption: ClassVar[bool] = False  # SanaPipeline.__call__'s default

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.instruction = inspect.signature(type(pipe).__call__).parameters["complex_human_instruction"].default

    def default_size(self) -> int:
        return DEFAULT_SIZE

    def aspect_ratio_bins(self) -> dict[str, list[float]]:
        from diffusers.pipelines.pixart_alpha import pipeline_pixart_alpha as alpha
        from diffusers.pipelines.pixart_alpha import pipeline_pixart_sigma as sigma
        from diffusers.pipelines.sana import pipeline_sana as sana

        tables = {
            128: sana.ASPECT_RATIO_4096_BIN,
            64: sigma.ASPECT_RATIO_2048_BIN,
            32: alpha.ASPECT_RATIO_1024_BIN,
            16: alpha.ASPECT_RATIO_512_BIN,
        }
        return tables.get(self.pipe.transformer.config.sample_size, {})

    def _encode(self, prompts: list[str], jobs: list[DiffusionJob], instruction: Any) -> dict[str, torch.Tensor]:
        embeds, mask, _, _ = self.pipe.encode_prompt(
            prompts,
            do_classifier_free_guidance=False,
            num_images_per_prompt=1,
            device=self.device,
            clean_caption=self.clean_caption,
            max_sequence_length=jobs[0].max_sequence_length,
            complex_human_instruction=instruction,
        )
        return {TEXT: embeds, MASK: mask}

    def embed(self, prompts: list[str], jobs: list[DiffusionJob]) -> dict[str, torch.Tensor]:
        return self._encode(prompts, jobs, self.instruction)

    def embed_negatives(self, jobs: list[DiffusionJob]) -> dict[str, torch.Tensor]:
        # diffusers encodes negatives without the instruction: max_sequence_length tokens, all of them kept
        return self._encode([j.negative_prompt or "" for j in jobs], jobs, None)

    def latent_dtype(self, job: DiffusionJob) -> torch.dtype:
        return torch.float32  # SanaPipeline.prepare_latents is called with float32

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        tr = self.pipe.transformer
        out = tr(
            x.to(dtype=tr.dtype),
            encoder_hidden_states=cond[TEXT].to(dtype=tr.dtype),
            encoder_attention_mask=cond[MASK],
            timestep=t * tr.config.timestep_scale,
            return_dict=False,
        )[0]
        return self.drop_learned_sigma(out.float())
