"""LongCat-AudioDiT for the diffusion engine: UMT5 -> LongCatAudioDiTTransformer -> LongCatAudioDiTVae.

Mirrors ``LongCatAudioDiTPipeline.__call__`` so that one request alone reproduces it. Unlike Stable Audio the
latent length *is* the clip's duration (``duration x sample_rate // hop`` frames; without a duration the
pipeline's estimate from the prompt's characters). The DiT takes a duration mask, though: a padded frame is
zeroed on input, excluded from self-attention as a key and zeroed in the output, so a clip padded with masked
frames denoises as it would alone (measured: the same float noise, ~5e-7, as sharing a batch at all). Each
request's latents are padded with zeros to the next multiple of ``FRAME_BUCKET`` frames, the batch key: clips
of different durations in one bucket share every forward; the decode takes each clip's own frames.

The DiT's text branch (embedder + four ConvNeXt blocks over the prompt tokens, whose GRN norms over the whole
sequence) does not depend on the step, and it sees padding: diffusers pads a call's prompts to the longest, so
a prompt's result depends on its batch mates. Here each prompt is encoded and run through the text branch
once, alone, at its own length (as a lone ``__call__`` does); the result's padding positions are zero after
the branch (the model masks them), so ``collate`` pads prompts of different lengths with zeros and a False
mask, which the cross-attention and the text mean ignore. ``predict`` is the transformer's ``forward`` from
there on, over the same modules.

CFG: the uncond row is the negative prompt's (its own length), or, without one, zeros in place of the prompt's
embeddings under the prompt's mask (diffusers runs it as a second forward; here it is one more row).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.input_checks import one_clip_from_text
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

DURATION = "duration"  # the request's length in seconds (diffusers' audio_duration_s)
# latent frames per batch bucket: at most FRAME_BUCKET - 1 padded frames of work per row (1.4 s of the real
# model's 11.7 frames/s), against one forward for every duration of the bucket
FRAME_BUCKET = 16


@dataclass
class LongCatAudioJob(DiffusionJob):
    """A request's LongCat-AudioDiT state, set in validate."""

    frames: int = 0  # latent frames: the clip is frames x hop samples long
    padded: int = 0  # frames rounded up to the batch bucket (the latents' length while denoising)


class LongCatAudioAdapter(DiffusersAdapter):
    job_class = LongCatAudioJob
    pipeline_class_name = "LongCatAudioDiTPipeline"

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.sample_rate = int(pipe.sample_rate)
        self.hop = int(pipe.vae_scale_factor)
        self.max_seconds = float(pipe.max_wav_duration)
        self.max_frames = int(pipe.max_wav_duration * self.sample_rate // self.hop)

    # ------------------------------------------------------------- request checks

    def validate(self, job: LongCatAudioJob) -> None:
        from diffusers.pipelines.longcat_audio_dit.pipeline_longcat_audio_dit import (
            _approx_duration_from_text,
            _normalize_text,
        )

        p = job.params
        one_clip_from_text(job, "LongCat-AudioDiT")
        seconds = p.extra_args.get(DURATION)
        if seconds is None:  # the pipeline's own estimate from the prompt (its characters), at most 30 s
            frames = int(_approx_duration_from_text([_normalize_text(job.prompt)]) * self.sample_rate // self.hop)
        else:
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
                raise InvalidRequestError(DURATION, f"expected a number of seconds, got {seconds!r}")
            if seconds <= 0 or seconds > self.max_seconds:
                raise InvalidRequestError(
                    DURATION, f"{seconds} s is outside this model's range: more than 0, at most {self.max_seconds:g} s"
                )
            frames = int(seconds * self.sample_rate // self.hop)
        job.frames = max(1, min(frames, self.max_frames))  # diffusers': at least one frame
        job.padded = -(-job.frames // FRAME_BUCKET) * FRAME_BUCKET
        job.rows = 1

    def batch_key(self, job: LongCatAudioJob) -> Hashable:
        return ("longcat_audio", job.padded)  # the padded latent length (module docstring)

    # ------------------------------------------------------------- preparation

    def _text(self, embeds: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The transformer's text branch for one prompt (its ``forward`` up to the masked ConvNeXt output)."""
        tr = self.pipe.transformer
        hidden = tr.text_embed(embeds.to(self.dtype), mask)
        if tr.text_conv:
            hidden = tr.text_conv_layer(hidden).masked_fill(mask.logical_not().unsqueeze(-1), 0.0)
        return {"text": hidden, "text_mask": mask}

    def encode(self, jobs: list[LongCatAudioJob]) -> None:
        from diffusers.pipelines.longcat_audio_dit.pipeline_longcat_audio_dit import _lens_to_mask, _normalize_text

        pipe = self.pipe
        for j in jobs:  # one prompt per encode_prompt call: no padding, as a lone __call__ (module docstring)
            embeds, lengths = pipe.encode_prompt([_normalize_text(j.prompt)], self.device)
            mask = _lens_to_mask(lengths, length=embeds.shape[1])
            # the duration mask: the clip's frames, then its padding
            frames = _lens_to_mask(torch.tensor([j.frames], device=self.device), length=j.padded)
            j.cond = {**self._text(embeds, mask), "frames_mask": frames}
            if not j.do_cfg:
                continue
            if j.negative_prompt is None:  # zeros under the prompt's mask
                j.uncond = {**self._text(torch.zeros_like(embeds), mask), "frames_mask": frames}
            else:  # diffusers does not normalise the negative prompt
                neg, neg_lengths = pipe.encode_prompt([j.negative_prompt], self.device)
                neg_mask = _lens_to_mask(neg_lengths, length=neg.shape[1])
                j.uncond = {**self._text(neg, neg_mask), "frames_mask": frames}

    def collate(self, conds: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Prompts of different lengths in one forward: zero text, False mask after each one's end."""
        longest = max(c["text"].shape[1] for c in conds)
        text = [F.pad(c["text"], (0, 0, 0, longest - c["text"].shape[1])) for c in conds]
        mask = [F.pad(c["text_mask"], (0, longest - c["text_mask"].shape[1]), value=False) for c in conds]
        frames = torch.cat([c["frames_mask"] for c in conds])
        return {"text": torch.cat(text), "text_mask": torch.cat(mask), "frames_mask": frames}

    def timesteps(self, job: LongCatAudioJob) -> None:
        n = job.params.num_inference_steps
        sigmas = torch.linspace(1.0, 1.0 / n, n, dtype=torch.float32).tolist()  # __call__'s schedule
        job.sampler_state = self.sampler.make_state(n, device=self.device, sigmas=sigmas)

    def init_latents(self, job: LongCatAudioJob) -> None:
        shape = (1, job.frames, self.pipe.latent_dim)  # prepare_latents' draw, then the bucket's zero padding
        job.latents = F.pad(self.noise(job, shape, job.cond["text"].dtype), (0, 0, 0, job.padded - job.frames))

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        """``LongCatAudioDiTTransformer.forward`` after its text branch (done once per prompt in encode), with
        ``__call__``'s zero latent condition and each row's duration mask."""
        tr, cfg = self.pipe.transformer, self.pipe.transformer.config
        dtype = x.dtype
        frames, mask = x.shape[1], cond["frames_mask"]
        timestep = (t / self.pipe.scheduler.config.num_train_timesteps).to(dtype)
        timestep_embed = tr.time_embed(timestep)
        text, text_mask = cond["text"], cond["text_mask"]
        hidden = tr.input_embed(x, mask)
        if tr.use_latent_condition:
            latent_cond = tr.latent_embed(torch.zeros_like(x), mask)
            hidden = tr.latent_cond_embedder(torch.cat([hidden, latent_cond], dim=-1))
        residual = hidden.clone() if cfg.long_skip else None
        rope = tr.rotary_embed(hidden, frames)
        cond_rope = tr.rotary_embed(text, text.shape[1])
        adaln_global_out = None
        norm_cond = timestep_embed
        if cfg.adaln_type == "global":
            if cfg.adaln_use_text_cond:
                text_len = text_mask.sum(1).clamp(min=1).to(text.dtype)
                norm_cond = timestep_embed + text.sum(1) / text_len.unsqueeze(1)
            adaln_global_out = tr.adaln_global_mlp(norm_cond)
        for block in tr.blocks:
            hidden = block(
                hidden_states=hidden,
                timestep_embed=timestep_embed,
                cond=text,
                mask=mask,
                cond_mask=text_mask,
                rope=rope,
                cond_rope=cond_rope,
                adaln_global_out=adaln_global_out,
            )
        if cfg.long_skip:
            hidden = hidden + residual
        hidden = tr.proj_out(tr.norm_out(hidden, norm_cond))
        return hidden * mask.unsqueeze(-1).to(hidden.dtype)

    def decode(self, jobs: list[LongCatAudioJob]) -> list[list[Any]]:
        vae = self.pipe.vae
        out: dict[int, np.ndarray] = {}
        for frames in sorted({j.frames for j in jobs}):  # one decode per length (a batch holds one)
            group = [j for j in jobs if j.frames == frames]
            latents = torch.cat([j.latents[:, :frames] for j in group])  # the clip's frames, not the padding
            audio = vae.decode(latents.permute(0, 2, 1)).sample
            for i, j in enumerate(group):
                out[id(j)] = audio[i, 0].float().cpu().numpy()  # mono: float32 [samples]
        return [[out[id(j)]] for j in jobs]

    def pack_output(self, job: LongCatAudioJob, decoded: list[Any]) -> dict[str, Any]:
        return {"audio": np.ascontiguousarray(decoded[0]), "sample_rate": self.sample_rate}
