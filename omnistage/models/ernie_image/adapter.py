"""ERNIE-Image for the diffusion engine: prompt enhancer (optional) -> Mistral 3 text encoder ->
ErnieImageTransformer2DModel -> FLUX.2's VAE.

Mirrors ``ErnieImagePipeline.__call__`` step by step so that one request alone reproduces it. What differs from
the other flow-matching families:

- the prompt enhancer (``use_pe``, the pipeline's default: on when the folder has one) rewrites each prompt with a
  sampled ``generate`` before encoding; the rewrite is the answer's ``revised_prompt``. diffusers samples it from
  torch's global generator; here that generator is seeded with the request's seed for the rewrite alone (and put
  back after), so ``torch.manual_seed(seed)`` before the pipeline's call reproduces a request's rewrite;
- every prompt is encoded alone, unpadded (the second-to-last hidden state); the transformer takes a padded batch
  with each row's length and masks the padding, so prompts of any length share a forward;
- latents are the VAE's 2x2 patches, de-normalised by the VAE's batch-norm statistics before decoding.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.text_padding import pad_texts
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

DEFAULT_SIZE = 1024  # ErnieImagePipeline.__call__'s default height and width
BN_EPS = 1e-5  # the pipeline's batch-norm epsilon when it de-normalises latents (not the VAE config's)
TEXT, LENS = "text_bth", "text_lens"


@dataclass
class ErnieImageJob(DiffusionJob):
    """A request's ERNIE-Image state, set in validate (the rewrite in encode)."""

    use_pe: bool = False
    revised_prompt: str | None = None


class ErnieImageAdapter(DiffusersAdapter):
    job_class = ErnieImageJob
    pipeline_class_name = "ErnieImagePipeline"

    def default_size(self) -> int:
        return DEFAULT_SIZE

    def validate(self, job: ErnieImageJob) -> None:
        p = job.params
        if job.images:
            raise InvalidRequestError("multi_modal_data.image", "ERNIE-Image is text-to-image only; it takes no image")
        if p.true_cfg_scale is not None:
            raise InvalidRequestError("true_cfg_scale", "not used by ERNIE-Image: guidance_scale > 1 runs its CFG")
        if p.max_sequence_length is not None:
            raise InvalidRequestError("max_sequence_length", "ERNIE-Image encodes each prompt at its own length")
        self.validate_size(job, f"VAE factor {self.pipe.vae_scale_factor}")
        has_pe = self.pipe.pe is not None and self.pipe.pe_tokenizer is not None
        use_pe = p.extra_args.get("use_pe")
        if use_pe and not has_pe:
            raise InvalidRequestError("use_pe", "this checkpoint has no prompt enhancer (no pe folder)")
        job.use_pe = has_pe if use_pe is None else bool(use_pe)
        self.validate_rows(job)

    def batch_key(self, job: ErnieImageJob) -> Hashable:
        # prompts of any token length share a forward: the transformer masks the padding
        return ("ernie_image", job.height, job.width)

    # ------------------------------------------------------------- preparation

    def enhance(self, job: ErnieImageJob) -> str:
        """The enhancer's rewrite of the job's prompt, sampled from the global generator seeded with the job's seed
        (restored afterwards)."""
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(job.generator.initial_seed())
            return self.pipe._enhance_prompt_with_pe(job.prompt, self.device, width=job.width, height=job.height)

    def encode(self, jobs: list[ErnieImageJob]) -> None:
        for j in jobs:
            if j.use_pe:
                j.prompt = j.revised_prompt = self.enhance(j)
        for j, e in zip(jobs, self.pipe.encode_prompt([j.prompt for j in jobs], self.device)):
            j.cond = {TEXT: self.repeat_rows(e[None], j.rows)}
        cfg = [j for j in jobs if j.do_cfg]
        if cfg:
            for j, e in zip(cfg, self.pipe.encode_prompt([j.negative_prompt or "" for j in cfg], self.device)):
                j.uncond = {TEXT: self.repeat_rows(e[None], j.rows)}

    def collate(self, conds: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        padded, lengths = pad_texts([c[TEXT] for c in conds])
        return {TEXT: padded, LENS: torch.tensor(lengths, device=padded.device)}

    def timesteps(self, job: ErnieImageJob) -> None:
        n = job.params.num_inference_steps
        sigmas = torch.linspace(1.0, 0.0, n + 1)[:-1]  # the pipeline's schedule, shifted by the scheduler
        job.sampler_state = self.sampler.make_state(n, device=self.device, sigmas=sigmas)

    def init_latents(self, job: ErnieImageJob) -> None:
        f = self.pipe.vae_scale_factor
        shape = (job.rows, self.pipe.transformer.config.in_channels, job.height // f, job.width // f)
        job.latents = self.noise(job, shape, self.pipe.transformer.dtype)

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        model = self.pipe.transformer
        text = cond[TEXT].to(model.dtype)
        return model(x.to(model.dtype), t.to(model.dtype), text, cond[LENS], return_dict=False)[0]

    def decode(self, jobs: list[ErnieImageJob]) -> list[list[Any]]:
        vae = self.pipe.vae
        latents = torch.cat([j.latents for j in jobs])
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + BN_EPS).to(latents.device, latents.dtype)
        latents = self.pipe._unpatchify_latents(latents * std + mean)
        return self.to_uint8(vae.decode(latents, return_dict=False)[0], jobs)

    def pack_output(self, job: ErnieImageJob, decoded: list[Any]) -> dict[str, Any]:
        if job.revised_prompt is None:
            return {"image": decoded}
        return {"image": decoded, "revised_prompt": job.revised_prompt}
