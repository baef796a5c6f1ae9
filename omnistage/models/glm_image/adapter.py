"""GLM-Image's diffusion half (GlmImageTransformer2DModel + VAE) for the diffusion engine.

Mirrors ``GlmImagePipeline.__call__`` given ``prior_token_ids`` step by step,
so one request alone reproduces it exactly. The AR model is not loaded here:
its tokens arrive in the stage inputs from the edge processor
(``edges.ar_tokens_to_prior``):

- ``prior_token_ids``: the target grid's AR token ids (one per 32x32 px, row major);
- ``prior_grid``: ``[token_h, token_w]`` of that grid.

The conditional and unconditional passes cannot share a forward (the glyph
embedding of the prompt and of "" differ in length and the transformer takes
no text mask), hence ``separate_cfg_passes``. Requests batch when resolution
and glyph length match.
"""

from __future__ import annotations

from typing import Any, Hashable

import numpy as np
import torch

from omnistage.models.glm_image.grid import AR_FACTOR
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

MAX_SEQUENCE_LENGTH = 2048  # diffusers' default for the glyph encoder


class GlmImageAdapter(DiffusersAdapter):
    pipeline_class_name = "GlmImagePipeline"
    separate_cfg_passes = True

    @classmethod
    def load(cls, folder: str, dtype: torch.dtype, device: torch.device) -> "GlmImageAdapter":
        from diffusers import GlmImagePipeline

        # The AR model and its processor belong to stage 0: not loaded here.
        pipe = GlmImagePipeline.from_pretrained(folder, dtype=dtype, vision_language_encoder=None, processor=None)
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, dtype, device)

    def size_multiple(self) -> int:
        return AR_FACTOR

    # ------------------------------------------------------------- request checks

    def validate(self, job: DiffusionJob) -> None:
        p = job.params
        if job.images:
            raise ValueError("multi_modal_data.image: image-to-image is not supported by this GLM-Image stage yet")
        if job.negative_prompt:
            raise ValueError("negative_prompt: GLM-Image does not take a negative prompt (its uncond pass uses \"\")")
        ids, grid = job.inputs.get("prior_token_ids"), job.inputs.get("prior_grid")
        if ids is None or grid is None:
            raise ValueError("prior_token_ids: the GLM-Image diffusion stage needs the AR stage's prior tokens "
                             "(prior_token_ids and prior_grid)")
        if (not isinstance(grid, (list, tuple)) or len(grid) != 2
                or not all(isinstance(g, int) and g > 0 for g in grid)):
            raise ValueError(f"prior_grid: expected [token_h, token_w] positive integers, got {grid!r}")
        th, tw = grid
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        if ids.numel() != th * tw:
            raise ValueError(f"prior_token_ids: {ids.numel()} ids do not fill the {th}x{tw} prior grid")
        codebook = self.pipe.transformer.config.prior_vq_quantizer_codebook_size
        if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < codebook):
            raise ValueError(f"prior_token_ids: ids must lie in 0..{codebook - 1}")
        for name, grid_px in (("height", th * AR_FACTOR), ("width", tw * AR_FACTOR)):
            given = getattr(p, name)
            if given is not None and given != grid_px:
                raise ValueError(f"{name}: {given} differs from the AR stage's prior grid ({grid_px} px)")
            setattr(job, name, grid_px)
        msl = p.max_sequence_length or MAX_SEQUENCE_LENGTH
        job.extra["max_sequence_length"] = msl
        job.extra["prior"] = self.pipe._upsample_token_ids(ids, th, tw).to(self.device)
        job.extra["glyph_len"] = self._glyph_len(job.prompt, msl)
        job.rows = p.num_outputs_per_prompt

    def _glyph_len(self, prompt: str, msl: int) -> int:
        """Length of ``_get_glyph_embeds`` for this prompt (each glyph text padded to even length)."""
        texts = self.pipe.get_glyph_texts(prompt)[0] or [""]
        ids = self.pipe.tokenizer(texts, max_length=msl, truncation=True).input_ids
        return sum(len(i) + (len(i) + 1) % 2 for i in ids)

    def batch_key(self, job: DiffusionJob) -> Hashable:
        # no text mask in the transformer: glyph length and latent size must match inside a batch
        return ("glm_image", job.height, job.width, job.extra["glyph_len"])

    # ------------------------------------------------------------- preparation

    def encode(self, jobs: list[DiffusionJob]) -> None:
        empty = None
        for j in jobs:
            msl = j.extra["max_sequence_length"]
            # diffusers encodes each prompt on its own (one glyph-encoder call per prompt)
            embeds = self.pipe._get_glyph_embeds([j.prompt], msl, self.device, self.dtype)
            dtype = embeds.dtype
            size = torch.tensor([[j.height, j.width]], dtype=dtype, device=self.device)
            common = {"prior_token_id": self.repeat_rows(j.extra["prior"], j.rows),
                      "target_size": self.repeat_rows(size, j.rows),
                      "crop_coords": torch.zeros((j.rows, 2), dtype=dtype, device=self.device)}
            drop = torch.zeros_like(common["prior_token_id"], dtype=torch.bool)
            j.cond = {"encoder_hidden_states": self.repeat_rows(embeds, j.rows), "prior_token_drop": drop, **common}
            if j.do_cfg:
                if empty is None or empty[0] != msl:
                    empty = (msl, self.pipe._get_glyph_embeds([""], msl, self.device, self.dtype))
                j.uncond = {"encoder_hidden_states": self.repeat_rows(empty[1], j.rows),
                            "prior_token_drop": torch.ones_like(drop), **common}

    def timesteps(self, job: DiffusionJob) -> None:
        from diffusers.pipelines.glm_image.pipeline_glm_image import calculate_shift

        cfg = self.pipe.scheduler.config
        steps = job.params.num_inference_steps
        f, patch = self.pipe.vae_scale_factor, self.pipe.transformer.config.patch_size
        seq_len = ((job.height // f) * (job.width // f)) // patch**2
        # the pipeline's own table: integer timesteps from num_train_timesteps down, sigmas = t / T
        timesteps = np.linspace(cfg.num_train_timesteps, 1.0, steps + 1)[:-1].astype(np.int64).astype(np.float32)
        sigmas = timesteps / cfg.num_train_timesteps
        mu = calculate_shift(seq_len, cfg.get("base_image_seq_len", 256), cfg.get("base_shift", 0.25),
                             cfg.get("max_shift", 0.75))
        job.sampler_state = self.sampler.make_state(steps, 0, device=self.device, timesteps=timesteps,
                                                    sigmas=sigmas, mu=mu)

    def init_latents(self, job: DiffusionJob) -> None:
        from diffusers.utils.torch_utils import randn_tensor

        f = self.pipe.vae_scale_factor
        shape = (job.rows, self.pipe.transformer.config.in_channels, job.height // f, job.width // f)
        dtype = job.cond["encoder_hidden_states"].dtype
        job.latents = randn_tensor(shape, generator=job.generator, device=self.device, dtype=dtype)

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        tr = self.pipe.transformer
        return tr(hidden_states=x.to(tr.dtype), encoder_hidden_states=cond["encoder_hidden_states"],
                  prior_token_id=cond["prior_token_id"], prior_token_drop=cond["prior_token_drop"],
                  timestep=t - 1,  # the pipeline feeds t - 1
                  target_size=cond["target_size"], crop_coords=cond["crop_coords"], return_dict=False)[0].float()

    def decode(self, jobs: list[DiffusionJob]) -> list[list[Any]]:
        vae = self.pipe.vae
        latents = torch.cat([j.latents for j in jobs]).to(vae.dtype)
        shape = (1, vae.config.latent_channels, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        std = torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
        return self.to_uint8(vae.decode(latents * std + mean, return_dict=False)[0], jobs)
