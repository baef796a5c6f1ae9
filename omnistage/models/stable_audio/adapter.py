"""Stable Audio (Open) for the diffusion engine: T5 + projection model -> StableAudioDiTModel -> Oobleck VAE.

Mirrors ``StableAudioPipeline.__call__`` step by step so that one request alone reproduces it. Why requests of
different durations share every forward: the DiT always denoises ``transformer.config.sample_size`` latent
frames (the model's longest clip); a request's duration only enters as conditioning (the projection model's
start/end-seconds embeddings, one cross-attention token each and the global token) and as the crop of the
decoded waveform. So the batch key is constant and the crop happens per request after the batched decode.

Conditioning per row: ``encoder_hidden_states`` (projected, masked prompt tokens + the start and end seconds
tokens) and ``global_hidden_states`` (the seconds side by side). The uncond row, as diffusers builds it: with
a negative prompt, that prompt's tokens (its padding zeroed before the projection) + the same seconds; without
one, all zeros for the cross-attention tokens and the cond row's global state. The scheduler (EDM DPM-Solver++,
SDE in Stable Audio Open's config) is multistep and draws noise in its step: each request steps through its own
copy with its own generator (``SchedulerSampler``).
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

DURATION = "duration"  # the request's length in seconds (diffusers' audio_end_in_s, starting at 0)


@dataclass
class StableAudioJob(DiffusionJob):
    """A request's Stable Audio state, set in validate."""

    seconds: float = 0.0  # the clip's length
    samples: int = 0  # ... in audio samples (the decoded audio is cut to it)


class StableAudioAdapter(DiffusersAdapter):
    job_class = StableAudioJob
    pipeline_class_name = "StableAudioPipeline"

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        from diffusers.models.embeddings import get_1d_rotary_pos_embed

        self.frames = int(pipe.transformer.config.sample_size)
        self.sample_rate = int(pipe.vae.config.sampling_rate)
        self.max_seconds = self.frames * pipe.vae.hop_length / self.sample_rate  # the pipeline's default length
        # the same for every request: the latent frames + the one prepended global token (__call__'s step 7)
        cos, sin = get_1d_rotary_pos_embed(
            pipe.rotary_embed_dim, self.frames + 1, use_real=True, repeat_interleave_real=False
        )
        self.rotary = (cos.to(device), sin.to(device))

    # ------------------------------------------------------------- request checks

    def validate(self, job: StableAudioJob) -> None:
        p = job.params
        one_clip_from_text(job, "Stable Audio")
        seconds = p.extra_args.get(DURATION, self.max_seconds)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise InvalidRequestError(DURATION, f"expected a number of seconds, got {seconds!r}")
        samples = int(float(seconds) * self.sample_rate)  # diffusers' waveform_end
        if samples < 1 or seconds > self.max_seconds:
            raise InvalidRequestError(
                DURATION, f"{seconds} s is outside this model's range: more than 0, at most {self.max_seconds:g} s"
            )
        job.seconds = float(seconds)
        job.samples = samples
        job.rows = 1

    def batch_key(self, job: StableAudioJob) -> Hashable:
        # every request denoises the same number of latent frames: any durations share a forward
        return "stable_audio"

    # ------------------------------------------------------------- preparation

    def _texts(self, prompts: list[str], zero_padding: bool) -> torch.Tensor:
        """``encode_prompt``'s T5 pass + projection for a batch of prompts (one row each): padded to the
        tokenizer's length, the padding's embeddings zeroed before the projection for negatives
        (``zero_padding``), every padding token zeroed after it."""
        pipe = self.pipe
        tokens = pipe.tokenizer(
            prompts, padding="max_length", max_length=pipe.tokenizer.model_max_length, truncation=True,
            return_tensors="pt",
        )  # fmt: skip
        ids, mask = tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
        embeds = pipe.text_encoder(ids, attention_mask=mask)[0]
        if zero_padding:
            embeds = torch.where(mask.to(torch.bool).unsqueeze(2), embeds, 0.0)
        embeds = pipe.projection_model(text_hidden_states=embeds).text_hidden_states
        embeds = embeds * mask.unsqueeze(-1).to(embeds.dtype)
        return embeds * mask.unsqueeze(-1).to(embeds.dtype)  # twice, as encode_prompt does (a no-op on 0/1)

    def _seconds(self, jobs: list[StableAudioJob]) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.pipe.projection_model(
            start_seconds=torch.zeros(len(jobs), device=self.device),
            end_seconds=torch.tensor([j.seconds for j in jobs]).to(self.device),
        )
        return out.seconds_start_hidden_states, out.seconds_end_hidden_states

    def encode(self, jobs: list[StableAudioJob]) -> None:
        texts = self._texts([j.prompt for j in jobs], zero_padding=False)
        start, end = self._seconds(jobs)
        for i, j in enumerate(jobs):
            seconds = (start[i : i + 1], end[i : i + 1])
            j.cond = {
                "encoder_hidden_states": torch.cat([texts[i : i + 1], *seconds], dim=1),
                "global_hidden_states": torch.cat(seconds, dim=2),
            }
        negative = [j for j in jobs if j.do_cfg and j.negative_prompt is not None]
        rows: dict[int, torch.Tensor] = {}
        if negative:
            texts = self._texts([j.negative_prompt for j in negative], zero_padding=True)
            rows = {id(j): texts[i : i + 1] for i, j in enumerate(negative)}
        for j in jobs:
            if not j.do_cfg:
                continue
            if id(j) in rows:
                seconds = j.cond["encoder_hidden_states"][:, -2:]
                hidden = torch.cat([rows[id(j)], seconds], dim=1)
            else:  # no negative prompt: the null conditioning is all zeros (the seconds tokens too)
                hidden = torch.zeros_like(j.cond["encoder_hidden_states"])
            j.uncond = {"encoder_hidden_states": hidden, "global_hidden_states": j.cond["global_hidden_states"]}

    def timesteps(self, job: StableAudioJob) -> None:
        job.sampler_state = self.sampler.make_state(job.params.num_inference_steps, device=self.device)

    def init_latents(self, job: StableAudioJob) -> None:
        shape = (1, self.pipe.transformer.config.in_channels, self.frames)
        dtype = job.cond["encoder_hidden_states"].dtype  # prepare_latents draws in the embeddings' dtype
        job.latents = self.noise(job, shape, dtype) * self.pipe.scheduler.init_noise_sigma

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.pipe.transformer(
            x,
            t,
            encoder_hidden_states=cond["encoder_hidden_states"],
            global_hidden_states=cond["global_hidden_states"],
            rotary_embedding=self.rotary,
            return_dict=False,
        )[0]

    def decode(self, jobs: list[StableAudioJob]) -> list[list[Any]]:
        vae = self.pipe.vae
        audio = vae.decode(torch.cat([j.latents for j in jobs]).to(vae.dtype)).sample
        # each request's clip: its own length cut from the model's whole window, float32 [channels, samples]
        return [[audio[i, :, : j.samples].float().cpu().numpy()] for i, j in enumerate(jobs)]

    def pack_output(self, job: StableAudioJob, decoded: list[Any]) -> dict[str, Any]:
        return {"audio": np.ascontiguousarray(decoded[0]), "sample_rate": self.sample_rate}
