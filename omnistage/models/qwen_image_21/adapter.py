"""Qwen-Image-2.1 (Qwen3-VL -> QwenImage21Transformer2DModel -> AutoencoderKLQwenImage21) for the diffusion
engine, text-to-image.

Mirrors ``QwenImage21Pipeline.__call__`` step by step so that one request alone reproduces it:

- the Qwen3-VL encoder's last hidden states before its final norm, the system turn dropped, each prompt at its
  own unpadded length (encoded alone, as diffusers encodes one prompt);
- RoPE places the target image after the text (its frame index is the text length) and the transformer reads
  one layout for the whole batch, so padding would move it: the batch key fixes the output size and the text
  lengths (the prompt's, and the negative's when the request runs CFG), counted by the tokenizer in validate;
- latents are 64-channel tokens at the VAE's 16x grid (``[rows, h*w, C]``), drawn as ``[rows, 1, C, h, w]``
  from the request's generator; the transformer folds 2x2 of them per slot itself (``img_mask``: the text
  positions, then the target image's slots);
- true CFG: ``true_cfg_scale`` > 1 with a negative prompt (diffusers' ``do_true_cfg``), as a second forward
  (its text differs in length), combined ``u + s * (c - u)``;
- the schedule is the pipeline's ``sample_sigmas`` when the folder declares them, else linspace(1, 1/n),
  dynamically shifted for the target's token count;
- the transformer's prefix KV cache (``use_kv_cache``) is not used: a shared forward holds rows at different
  steps, so every step recomputes the text keys and values. The text tokens are block-causal and modulated at
  t = 0, so this is the same function (in fp32 the tiny fixture's outputs are equal either way, see the tests).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

TEXT = "encoder_hidden_states"
GRID = "latent_grid"  # (h, w) of the target's latent tokens per row: the transformer's img_shapes
DEFAULT_TRUE_CFG = 1.0  # QwenImage21Pipeline.__call__'s default: no CFG unless asked for
DEFAULT_SIZE = 1024  # __call__'s output_resolution


class QwenImage21Adapter(DiffusersAdapter):
    pipeline_class_name = "QwenImage21Pipeline"
    separate_cfg_passes = True  # cond and uncond text differ in length, and diffusers runs them apart

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.latent_channels = pipe.transformer.config.in_channels

    # ------------------------------------------------------------- request checks

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2  # VAE factor x the transformer's 2x2 slots

    def default_size(self) -> int:
        return DEFAULT_SIZE

    def validate(self, job: DiffusionJob) -> None:
        p = job.params
        if job.images:
            raise InvalidRequestError("multi_modal_data.image", "Qwen-Image-2.1 condition images are not served yet "
                                      "(text-to-image only)")
        if p.strength is not None:
            raise InvalidRequestError("strength", "not used by Qwen-Image-2.1 (no image-to-image)")
        if p.max_sequence_length is not None:
            raise InvalidRequestError("max_sequence_length", "Qwen-Image-2.1 encodes the whole prompt (no limit "
                                      "to set)")
        scale = p.true_cfg_scale if p.true_cfg_scale is not None else DEFAULT_TRUE_CFG
        if scale > 1 and job.negative_prompt is None:
            # diffusers would quietly skip the negative pass; an explicit scale without one is refused instead
            raise InvalidRequestError("negative_prompt", f"true_cfg_scale={scale} > 1 needs a negative prompt "
                                      "(true CFG runs a second pass on it; \" \" will do)")
        self.validate_size(job, f"VAE factor {self.pipe.vae_scale_factor} x 2x2 slots")
        job.cfg = scale > 1 and job.negative_prompt is not None
        job.cfg_scale = scale
        job.rows = p.num_outputs_per_prompt
        job.extra["text_lengths"] = (self.text_length(job.prompt),
                                     self.text_length(job.negative_prompt) if job.cfg else None)

    def text_length(self, prompt: str) -> int:
        """The prompt's embedding length: its templated tokens less the system turn (``_get_qwen_prompt_embeds``)."""
        pipe = self.pipe
        text = pipe.prompt_template_t2i.format(prompt or " ")  # diffusers encodes an empty prompt as " "
        return len(pipe.processor.tokenizer(text)["input_ids"]) - pipe._drop_idx

    def batch_key(self, job: DiffusionJob) -> Hashable:
        # one RoPE layout per forward (img_shapes and img_mask of the first row): size and text lengths fixed
        return ("qwen_image_21", job.height, job.width, job.extra["text_lengths"])

    def latent_grid(self, job: DiffusionJob) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor
        return 2 * (job.height // (f * 2)), 2 * (job.width // (f * 2))

    # ------------------------------------------------------------- prompt encoding

    def embed_one(self, prompt: str) -> torch.Tensor:
        embeds, _, _ = self.pipe._get_qwen_prompt_embeds(prompt, None, self.device)
        return embeds  # [1, length, dim]: one prompt has no padding (diffusers passes no mask then)

    def encode(self, jobs: list[DiffusionJob]) -> None:
        for j in jobs:
            grid = torch.tensor([self.latent_grid(j)], dtype=torch.long, device=self.device)
            j.cond = {TEXT: self.repeat_rows(self.embed_one(j.prompt), j.rows), GRID: grid.expand(j.rows, 2)}
            if j.do_cfg:
                j.uncond = {TEXT: self.repeat_rows(self.embed_one(j.negative_prompt), j.rows),
                            GRID: grid.expand(j.rows, 2)}

    # ------------------------------------------------------------- schedule and latents

    def timesteps(self, job: DiffusionJob) -> None:
        n = job.params.num_inference_steps
        sigmas = self.pipe.config.get("sample_sigmas")
        if sigmas is None:
            sigmas = np.linspace(1.0, 1 / n, n)
        else:  # the folder's own grid; its length is the step count, as in __call__
            n = len(sigmas)
        h, w = self.latent_grid(job)
        state = self.sampler.make_state(n, device=self.device, sigmas=sigmas, mu=self.dynamic_shift_mu(h * w))
        state.scheduler.set_begin_index(0)  # as the pipeline does before its loop
        job.sampler_state = state

    def init_latents(self, job: DiffusionJob) -> None:
        h, w = self.latent_grid(job)
        noise = self.noise(job, (job.rows, 1, self.latent_channels, h, w), job.cond[TEXT].dtype)
        job.latents = noise.view(job.rows, self.latent_channels, h * w).transpose(1, 2)  # _pack_latents

    # ------------------------------------------------------------- the batched part

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        tr = self.pipe.transformer
        text = cond[TEXT]
        h, w = (int(v) for v in cond[GRID][0])
        # the text positions, then one slot per 2x2 target tokens (the pipeline's append_target_slots)
        img_mask = torch.cat([torch.zeros(x.shape[0], text.shape[1], dtype=torch.bool, device=x.device),
                              torch.ones(x.shape[0], h * w // 4, dtype=torch.bool, device=x.device)], dim=1)
        out = tr(hidden_states=x, timestep=t.to(x.dtype) / 1000, encoder_hidden_states=text,
                 img_shapes=[[(1, h, w)]] * x.shape[0],
                 img_mask=img_mask, return_dict=False)[0]
        return out[:, -x.shape[1]:]

    def decode(self, jobs: list[DiffusionJob]) -> list[list[np.ndarray]]:
        vae = self.pipe.vae
        h, w = self.latent_grid(jobs[0])
        x = torch.cat([j.latents for j in jobs])
        x = x.transpose(1, 2).reshape(x.shape[0], self.latent_channels, 1, h, w).to(vae.dtype)  # _unpack_latents
        mean, std = self.channel_stats(x)
        return self.to_uint8(vae.decode(x * std + mean, return_dict=False)[0][:, :, 0], jobs)
