"""Stable Audio 3 for the diffusion engine: T5Gemma + duration -> StableAudio3DiTModel -> AutoencoderSAME.

Mirrors ``StableAudio3Pipeline.__call__`` so that one request alone reproduces it. The latent length follows
the duration (``ceil(duration x rate / hop)`` frames), and ``StableAudio3DiTModel.forward`` takes no latent
mask: its self-attention and the memory tokens see every frame, so a clip padded to share a forward would not
denoise as it does alone. The batch key is therefore the latent length: requests of one length (any prompts,
seeds, guidance, step counts) share forwards; other lengths wait their turn (the engine's ``max_wait_steps``).

Prompts are always padded to the tokenizer's length (at most 256 tokens, ``encode_prompt``'s rule) and the DiT
replaces padded positions with its learned padding embedding, attending to the whole context: rows of
different prompts stack without further padding. Each prompt is still encoded alone (a lone ``__call__``'s
batch of one), and the duration embedding is appended to the cond and the uncond context as one more token
(``prepare_cross_attention``), besides being each row's global (AdaLN) vector.

Sampling: the scheduler's log-SNR sigma schedule (``logsnr_sigma_schedule`` with ``__call__``'s default
bounds) through each request's own scheduler copy. The distilled checkpoint's ping-pong step
(``stochastic_sampling=True``) draws fresh noise from the request's generator every step, as
``scheduler.step(..., generator=generator)`` does; the base checkpoint's deterministic Euler step is vectorised
(``make_sampler``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.input_checks import one_clip_from_text
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

DURATION = "duration"  # the request's length in seconds (diffusers' ``duration``)
DEFAULT_SECONDS = 10.0  # StableAudio3Pipeline.__call__'s default duration
LOGSNR_MIN, LOGSNR_MAX = -6.2, 2.0  # __call__'s default schedule bounds


@dataclass
class StableAudio3Job(DiffusionJob):
    """A request's Stable Audio 3 state, set in validate."""

    seconds: float = 0.0
    frames: int = 0  # latent frames: ceil(seconds x rate / hop)
    samples: int = 0  # the clip's samples after the decode is trimmed: int(seconds x rate)


class StableAudio3Adapter(DiffusersAdapter):
    job_class = StableAudio3Job
    pipeline_class_name = "StableAudio3Pipeline"

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.sample_rate = int(pipe.vae.config.sampling_rate)
        self.hop = int(pipe.vae.downsampling_ratio)
        # the duration embedder clamps longer durations to this: beyond it the model has no conditioning for them
        self.max_seconds = float(pipe.duration_embedder.config.max_val)

    # ------------------------------------------------------------- request checks

    def validate(self, job: StableAudio3Job) -> None:
        p = job.params
        one_clip_from_text(job, "Stable Audio 3")
        seconds = p.extra_args.get(DURATION)
        seconds = DEFAULT_SECONDS if seconds is None else seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise InvalidRequestError(DURATION, f"expected a number of seconds, got {seconds!r}")
        samples = int(seconds * self.sample_rate)  # __call__'s waveform_length
        if samples < 1 or seconds > self.max_seconds:
            raise InvalidRequestError(
                DURATION, f"{seconds} s is outside this model's range: more than 0, at most {self.max_seconds:g} s"
            )
        job.seconds = float(seconds)
        job.frames = int(math.ceil(job.seconds * self.sample_rate / self.hop))  # __call__'s latent_length
        job.samples = samples
        job.rows = 1

    def batch_key(self, job: StableAudio3Job) -> Hashable:
        return ("stable_audio3", job.frames)  # the DiT masks no frame: one latent length per forward

    # ------------------------------------------------------------- preparation

    def _context(self, prompt: str, duration_token: torch.Tensor) -> dict[str, torch.Tensor]:
        """One prompt's cross-attention context (``encode_prompt`` for a batch of one, then the duration token)."""
        pipe = self.pipe
        embeds, mask = pipe.encode_prompt(prompt, self.device, 1)
        context, context_mask = pipe.prepare_cross_attention(embeds, mask, duration_token)
        return {"context": context, "context_mask": context_mask, "global": duration_token}

    def encode(self, jobs: list[StableAudio3Job]) -> None:
        for j in jobs:  # one prompt per call, as a lone __call__ (module docstring)
            duration = self.pipe.encode_duration(j.seconds, self.device, 1, 1)
            j.cond = self._context(j.prompt, duration)
            if j.do_cfg:  # "" for a missing negative prompt, as __call__
                j.uncond = self._context(j.negative_prompt or "", duration)

    def timesteps(self, job: StableAudio3Job) -> None:
        from diffusers.pipelines.stable_audio_3.pipeline_stable_audio_3 import logsnr_sigma_schedule

        n = job.params.num_inference_steps
        sigmas = logsnr_sigma_schedule(n, LOGSNR_MIN, LOGSNR_MAX)
        job.sampler_state = self.sampler.make_state(n, device=self.device, sigmas=sigmas)

    def init_latents(self, job: StableAudio3Job) -> None:
        shape = (1, self.pipe.vae.config.latent_dim, job.frames)  # prepare_latents' draw
        job.latents = self.noise(job, shape, job.cond["context"].dtype)

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.pipe.transformer(
            x,
            t,
            encoder_hidden_states=cond["context"],
            global_hidden_states=cond["global"],
            encoder_attention_mask=cond["context_mask"],
            return_dict=False,
        )[0]

    def decode(self, jobs: list[StableAudio3Job]) -> list[list[Any]]:
        vae = self.pipe.vae
        out: dict[int, np.ndarray] = {}
        for frames in sorted({j.frames for j in jobs}):  # one decode per latent length
            group = [j for j in jobs if j.frames == frames]
            audio = vae.decode(torch.cat([j.latents for j in group]).to(vae.dtype)).sample
            for i, j in enumerate(group):  # __call__'s trim to the duration, then clamp: float32 [2, samples]
                out[id(j)] = audio[i, :, : j.samples].clamp(-1.0, 1.0).float().cpu().numpy()
        return [[out[id(j)]] for j in jobs]

    def pack_output(self, job: StableAudio3Job, decoded: list[Any]) -> dict[str, Any]:
        return {"audio": np.ascontiguousarray(decoded[0]), "sample_rate": self.sample_rate}
