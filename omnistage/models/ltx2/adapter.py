"""LTX-2 text/image-to-video with sound (one DiT denoising video and audio latents together) for the diffusion engine.

Mirrors ``LTX2Pipeline.__call__`` (and ``LTX2ImageToVideoPipeline.__call__``) so that one request alone reproduces
it exactly. A request's latents are one fp32 row holding its packed video tokens then its packed audio tokens
(flattened): the engine's flow-matching Euler step is elementwise, and both modalities use the same sigma table
(diffusers steps a copy of the scheduler for the audio), so one row steps both.

LTX-2's guidance is more than CFG, and it is applied in x0 space per modality: CFG against the negative prompt
(``guidance_scale`` for video, ``audio_guidance_scale`` for audio), spatio-temporal guidance (STG: a forward with
the self-attention of some blocks skipped) and modality-isolation guidance (a forward without the audio<->video
cross-attention), then a guidance rescale. ``predict`` therefore returns three predictions per row (the plain
forward, the STG forward, the isolated forward; the latter two only for the cond rows of requests that use them,
zeros elsewhere), each of the three forwards batched across requests as diffusers batches them for one request
(uncond and cond together, STG and isolation alone), and ``combine_guidance`` does the rest per request, in
diffusers' operation order.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.models.ltx2.request import LTX2Job, check_video
from omnistage.models.shared.flow_schedule import start_schedule
from omnistage.models.shared.input_checks import refuse_images
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

PLAIN, STG, ISOLATED = 0, 1, 2  # the three predictions predict() returns per row


class LTX2Adapter(DiffusersAdapter):
    job_class = LTX2Job
    pipeline_class_name = "LTX2Pipeline"
    # combine_guidance runs for every request, CFG or not: STG and modality isolation apply without CFG too
    guides_every_job: ClassVar[bool] = True

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.model = pipe.transformer
        self.model_dtype = pipe.text_encoder.dtype  # diffusers feeds the DiT in the prompt embeddings' dtype
        self.sr = pipe.vocoder.config.output_sampling_rate
        self.mel_bins = pipe.audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio
        self.audio_channels = pipe.audio_vae.config.latent_channels

    # ------------------------------------------------------------- request checks

    def validate(self, job: LTX2Job) -> None:
        refuse_images(
            job, "this is a text-to-video model; it takes no input image (serve an LTX2ImageToVideoPipeline folder)"
        )
        self.validate_video(job)

    def validate_video(self, job: LTX2Job) -> None:
        check_video(job, self.pipe)

    def batch_key(self, job: LTX2Job) -> Hashable:
        # dense latents (video and audio lengths), one RoPE frame rate and cross-timestep mode per forward; the
        # Gemma prompt is padded to max_sequence_length (masked), which must match. (STG blocks may differ: the
        # STG forward runs once per set of blocks.)
        return (
            "ltx2",
            job.height,
            job.width,
            self.latent_frames(job),
            job.audio_frames,
            job.rope_fps,
            job.cross,
            job.max_sequence_length,
        )

    def latent_frames(self, job: LTX2Job) -> int:
        return (job.num_frames - 1) // self.pipe.vae_temporal_compression_ratio + 1

    def video_tokens(self, job: LTX2Job) -> int:
        f = self.pipe.vae_spatial_compression_ratio
        return self.latent_frames(job) * (job.height // f) * (job.width // f)

    # ------------------------------------------------------------- preparation

    def encode(self, jobs: list[LTX2Job]) -> None:
        """Gemma over the prompts (one call) and the negatives (another, "" for a missing one), then the text
        connectors over [negatives of the CFG requests, prompts], as diffusers runs them for one request."""
        pipe, n = self.pipe, jobs[0].max_sequence_length

        def gemma(prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
            embeds, mask, _, _ = pipe.encode_prompt(
                prompts, do_classifier_free_guidance=False, max_sequence_length=n, device=self.device
            )
            return embeds, mask

        embeds, mask = gemma([j.prompt for j in jobs])
        cfg = [j for j in jobs if j.do_cfg]
        if cfg:
            neg, neg_mask = gemma([j.negative_prompt or "" for j in cfg])
            embeds, mask = torch.cat([neg, embeds]), torch.cat([neg_mask, mask])
        video, audio, conn_mask = pipe.connectors(
            embeds, mask, padding_side=getattr(pipe.tokenizer, "padding_side", "left")
        )
        rows = [(j, "uncond") for j in cfg] + [(j, "cond") for j in jobs]
        for i, (j, kind) in enumerate(rows):
            flags = torch.zeros(1, 3, dtype=torch.bool)  # which predictions this row asks for
            if kind == "cond":
                s = j.scales
                flags[0, STG] = s["stg_scale"] > 0 or s["audio_stg_scale"] > 0
                flags[0, ISOLATED] = s["modality_scale"] > 1 or s["audio_modality_scale"] > 1
            cond = {
                "video_embeds": video[i : i + 1],
                "audio_embeds": audio[i : i + 1],
                "mask": conn_mask[i : i + 1],
                "passes": flags,
                "geometry": self.geometry(j),
                "stg_blocks": self.stg_mask(j),
            }
            setattr(j, kind, cond)

    def timesteps(self, job: LTX2Job) -> None:
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

        n, cfg = job.params.num_inference_steps, self.pipe.scheduler.config
        mu = calculate_shift(
            self.video_tokens(job),
            cfg.get("base_image_seq_len", 1024),
            cfg.get("max_image_seq_len", 4096),
            cfg.get("base_shift", 0.95),
            cfg.get("max_shift", 2.05),
        )
        start_schedule(self, job, n, sigmas=self.sigmas(job), mu=mu)

    def sigmas(self, job: LTX2Job) -> Any:
        """The sigma table ``__call__`` passes the scheduler when the caller gives none."""
        n = job.params.num_inference_steps
        return np.linspace(1.0, 1 / n, n)

    def init_latents(self, job: LTX2Job) -> None:
        self.set_latents(job, self.video_noise(job))

    def video_noise(self, job: LTX2Job, *image: torch.Tensor) -> Any:
        """``pipe.prepare_latents`` for one request's video (the image-to-video pipeline takes the image first)."""
        return self.pipe.prepare_latents(
            *image,
            1,
            self.model.config.in_channels,
            job.height,
            job.width,
            job.num_frames,
            0.0,
            torch.float32,
            self.device,
            job.generator,
        )

    def set_latents(self, job: LTX2Job, video: torch.Tensor) -> None:
        """The packed video latents, then the audio noise (drawn after the video's, as diffusers draws it)."""
        audio = self.pipe.prepare_audio_latents(
            1,
            self.audio_channels,
            job.audio_frames,
            self.pipe.audio_vae.config.mel_bins,
            0.0,
            torch.float32,
            self.device,
            job.generator,
        )
        job.shapes = self.shapes(self.geometry(job)[0].tolist())
        job.latents = torch.cat([video.flatten(1), audio.flatten(1)], dim=1)

    # ------------------------------------------------------------- the batched parts

    def geometry(self, job: LTX2Job) -> torch.Tensor:
        """What a forward needs besides tensors, as one CPU row (the batch key makes it equal for every row):
        latent frames, height, width, audio length, RoPE frame rate, cross-timestep flag."""
        f = self.pipe.vae_spatial_compression_ratio
        return torch.tensor(
            [
                [
                    self.latent_frames(job),
                    job.height // f,
                    job.width // f,
                    job.audio_frames,
                    job.rope_fps,
                    float(job.cross),
                ]
            ],
            dtype=torch.float64,
        )

    def stg_mask(self, job: LTX2Job) -> torch.Tensor:
        mask = torch.zeros(1, self.model.config.num_layers, dtype=torch.bool)
        for b in job.stg_blocks:
            if b < mask.shape[1]:  # a block index past the model's depth perturbs nothing (as in diffusers)
                mask[0, b] = True
        return mask

    def shapes(self, geometry: list[float]) -> tuple[tuple[int, int], tuple[int, int]]:
        """(video tokens, video token width), (audio tokens, audio token width) of the packed latents."""
        frames, h, w, length = (int(v) for v in geometry[:4])
        p, pt = self.pipe.transformer_spatial_patch_size, self.pipe.transformer_temporal_patch_size
        video = ((frames // pt) * (h // p) * (w // p), self.model.config.in_channels * pt * p * p)
        return video, (length, self.audio_channels * self.mel_bins)

    @staticmethod
    def split(x: torch.Tensor, shapes: tuple[tuple[int, int], tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat rows -> packed video [rows, tokens, width] and audio [rows, length, width] (views)."""
        (s, d), (length, da) = shapes
        return x[:, : s * d].reshape(-1, s, d), x[:, s * d :].reshape(-1, length, da)

    def _forward(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor], **flags: Any) -> torch.Tensor:
        g = cond["geometry"][0].tolist()
        frames, h, w, length = (int(v) for v in g[:4])
        rope_fps, cross = g[4], bool(g[5])
        video, audio = self.split(x, self.shapes(g))
        n = x.shape[0]
        v, a = self.model(
            hidden_states=video.to(self.model_dtype),
            audio_hidden_states=audio.to(self.model_dtype),
            encoder_hidden_states=cond["video_embeds"],
            audio_encoder_hidden_states=cond["audio_embeds"],
            timestep=self.video_timestep(t, cond),
            audio_timestep=t,
            sigma=t,
            encoder_attention_mask=cond["mask"],
            audio_encoder_attention_mask=cond["mask"],
            num_frames=frames,
            height=h,
            width=w,
            fps=rope_fps,
            audio_num_frames=length,
            video_coords=self.model.rope.prepare_video_coords(n, frames, h, w, x.device, fps=rope_fps),
            audio_coords=self.model.audio_rope.prepare_audio_coords(n, length, x.device),
            use_cross_timestep=cross,
            return_dict=False,
            **flags,
        )
        return torch.cat([v.float().flatten(1), a.float().flatten(1)], dim=1)

    def video_timestep(self, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return t  # image-to-video: per token, zero on the first (given) frame

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        plain = self._forward(x, t, cond)
        out = plain.new_zeros((x.shape[0], 3, plain.shape[1]))
        out[:, PLAIN] = plain
        for kind, rows, flags in self.extra_passes(cond):
            sub = {k: v.index_select(0, rows.to(v.device)) for k, v in cond.items()}
            rows = rows.to(x.device)
            out[rows, kind] = self._forward(x.index_select(0, rows), t.index_select(0, rows), sub, **flags)
        return out

    @staticmethod
    def extra_passes(cond: dict[str, torch.Tensor]) -> list[tuple[int, torch.Tensor, dict[str, Any]]]:
        """(prediction, rows, forward flags) of the step's other forwards: STG once per set of perturbed blocks
        among the rows that use it, modality isolation once. (The flags live on the CPU: no device sync.)"""
        passes, masks = cond["passes"], cond["stg_blocks"]
        out = []
        stg_rows = passes[:, STG].nonzero().squeeze(1)
        for mask in torch.unique(masks.index_select(0, stg_rows), dim=0) if stg_rows.numel() else []:
            rows = stg_rows[(masks.index_select(0, stg_rows) == mask).all(dim=1)]
            # diffusers' STG forward perturbs nothing when no listed block exists; it is still its own forward
            out.append((STG, rows, {"spatio_temporal_guidance_blocks": mask.nonzero().squeeze(1).tolist() or None}))
        iso_rows = passes[:, ISOLATED].nonzero().squeeze(1)
        if iso_rows.numel():
            out.append((ISOLATED, iso_rows, {"isolate_modalities": True}))
        return out

    # ------------------------------------------------------------- guidance (per request, diffusers' order)

    def combine_guidance(self, u: torch.Tensor | None, c: torch.Tensor, job: LTX2Job) -> torch.Tensor:
        from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

        s, shapes = job.scales, job.shapes
        state = job.sampler_state
        sigma = state.sigmas[state.begin + job.step]
        x_video, x_audio = self.split(job.latents, shapes)
        preds = [self.split(c[:, k].contiguous(), shapes) for k in (PLAIN, STG, ISOLATED)]
        uncond = self.split(u[:, PLAIN].contiguous(), shapes) if u is not None else None
        passes = job.cond["passes"][0]
        out = []
        for m, (x, prefix) in enumerate(((x_video, ""), (x_audio, "audio_"))):
            x0 = x - preds[PLAIN][m] * sigma
            cfg_delta = stg_delta = mod_delta = 0
            if uncond is not None:
                cfg_delta = (s[prefix + "guidance_scale"] - 1) * (x0 - (x - uncond[m] * sigma))
            if passes[STG]:
                stg_delta = s[prefix + "stg_scale"] * (x0 - (x - preds[STG][m] * sigma))
            if passes[ISOLATED]:
                mod_delta = (s[prefix + "modality_scale"] - 1) * (x0 - (x - preds[ISOLATED][m] * sigma))
            guided = x0 + cfg_delta + stg_delta + mod_delta
            rescale = s[prefix + "guidance_rescale"]
            if rescale > 0:
                guided = rescale_noise_cfg(guided, x0, guidance_rescale=rescale)
            out.append(((x - guided) / sigma).flatten(1))
        self.keep_given_frames(out[0], job)
        return torch.cat(out, dim=1)

    def keep_given_frames(self, velocity: torch.Tensor, job: LTX2Job) -> None:
        """Image-to-video: the first latent frame is the input image's and is never stepped."""

    # ------------------------------------------------------------- output

    def decode(self, jobs: list[LTX2Job]) -> list[list[Any]]:
        pipe, f = self.pipe, self.pipe.vae_spatial_compression_ratio
        videos, audios = [], []
        for j in jobs:
            v, a = self.split(j.latents, j.shapes)
            v = pipe._unpack_latents(
                v,
                self.latent_frames(j),
                j.height // f,
                j.width // f,
                pipe.transformer_spatial_patch_size,
                pipe.transformer_temporal_patch_size,
            )
            v = v.to(self.model_dtype)
            timestep = None
            if pipe.vae.config.timestep_conditioning:  # decode_timestep 0.0, diffusers' default: noise x 0
                noise = self.noise(j, tuple(v.shape), v.dtype)
                timestep = torch.tensor([0.0], device=self.device, dtype=v.dtype)
                scale = torch.tensor([0.0], device=self.device, dtype=v.dtype)[:, None, None, None, None]
                v = (1 - scale) * v + scale * noise
            videos.append(
                (
                    pipe._denormalize_latents(
                        v, pipe.vae.latents_mean, pipe.vae.latents_std, pipe.vae.config.scaling_factor
                    ),
                    timestep,
                )
            )
            a = pipe._denormalize_audio_latents(a, pipe.audio_vae.latents_mean, pipe.audio_vae.latents_std)
            audios.append(pipe._unpack_audio_latents(a, j.audio_frames, num_mel_bins=self.mel_bins))
        latents = torch.cat([v for v, _ in videos]).to(pipe.vae.dtype)
        timestep = None if videos[0][1] is None else torch.cat([t for _, t in videos])
        video = pipe.vae.decode(latents, timestep, return_dict=False)[0]
        frames = pipe.video_processor.postprocess_video(video, output_type="np")  # [B, T, H, W, 3] in [0, 1]
        frames = (frames * 255).round().astype(np.uint8)  # the rounding diffusers uses for PIL output
        out: list[list[Any]] = [[np.ascontiguousarray(frames[i])] for i in range(len(jobs))]
        idx = [i for i, j in enumerate(jobs) if self.wants_audio(j)]
        if idx:
            mel = pipe.audio_vae.decode(
                torch.cat([audios[i] for i in idx]).to(pipe.audio_vae.dtype), return_dict=False
            )[0]
            wave = pipe.vocoder(mel).float().cpu().numpy()  # [B, channels, samples]
            for k, i in enumerate(idx):
                out[i].append(np.ascontiguousarray(wave[k]))
        return out

    @staticmethod
    def wants_audio(job: LTX2Job) -> bool:
        """A caller that asked for the video alone (``modalities: ["video"]``) gets no audio decode. (The audio
        latents are still denoised: the video attends to them at every step, so skipping the audio stream
        would change the video.)"""
        return job.wanted is None or "audio" in job.wanted

    def pack_output(self, job: LTX2Job, decoded: list[Any]) -> dict[str, Any]:
        out = {"video": decoded[0], "fps": job.fps}
        if len(decoded) > 1:
            out["audio"], out["sample_rate"] = decoded[1], self.sr
        return out
