"""Wan 2.1 / 2.2 text-to-video (3-D DiT, UMT5 text encoder, causal video VAE) for the diffusion engine.

Mirrors ``WanPipeline.__call__`` step by step so that one request alone
reproduces it exactly: fp32 latents [B, C, T', H', W'] from the request's
generator, the folder's scheduler (UniPC on flow sigmas for the released
checkpoints) stepped per request, cond and uncond as separate forwards (as
diffusers runs them: a B=2 forward differs from two B=1 forwards by float
batch variance), and Wan2.2's two experts switched per row at the boundary
timestep with ``guidance_scale_2`` in the low-noise phase.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Hashable

import numpy as np
import torch

from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

# WanPipeline.__call__'s own defaults (tests check they still agree)
DEFAULT_HEIGHT = 480
DEFAULT_WIDTH = 832
DEFAULT_NUM_FRAMES = 81
MAX_SEQUENCE_LENGTH = 512
DEFAULT_FPS = 16  # what the Wan releases export their videos at


class WanAdapter(DiffusersAdapter):
    pipeline_class_name = "WanPipeline"
    separate_cfg_passes = True

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
        self.model_dtype = model.dtype
        self.in_channels = model.config.in_channels
        self.patch = tuple(model.config.patch_size)  # (t, h, w)
        ratio = pipe.config.boundary_ratio
        self.boundary = None if ratio is None else ratio * pipe.scheduler.config.num_train_timesteps

    @classmethod
    def load(cls, folder: str, dtype: torch.dtype, device: torch.device) -> "WanAdapter":
        """One family entry point for text-to-video and image-to-video folders."""
        index = json.loads((Path(folder) / "model_index.json").read_text())
        if cls is WanAdapter and index.get("_class_name") == "WanImageToVideoPipeline":
            from omnistage.models.wan.i2v import WanI2VAdapter

            return WanI2VAdapter.load(folder, dtype, device)
        return super().load(folder, dtype, device)

    # ------------------------------------------------------------- request checks

    def validate(self, job: DiffusionJob) -> None:
        if job.images:
            raise ValueError("multi_modal_data.image: this is a text-to-video model; it takes no input image")
        self.validate_video(job)

    def validate_video(self, job: DiffusionJob) -> None:
        p = job.params
        f = self.pipe.vae_scale_factor_spatial
        for name, multiple, default in (("height", f * self.patch[1], DEFAULT_HEIGHT),
                                        ("width", f * self.patch[2], DEFAULT_WIDTH)):
            value = getattr(p, name) or default
            if value % multiple:
                raise ValueError(f"{name}: {value} is not divisible by {multiple} "
                                 f"(VAE factor {f} x patch size {multiple // f})")
            setattr(job, name, int(value))
        ft = self.pipe.vae_scale_factor_temporal
        frames = p.num_frames or DEFAULT_NUM_FRAMES
        if (frames - 1) % ft:
            lower = (frames - 1) // ft * ft + 1
            raise ValueError(f"num_frames: {frames} is not of the form {ft}k+1 (VAE temporal factor {ft}); "
                             f"try {lower} or {lower + ft}")
        job.extra["num_frames"] = frames
        if p.num_outputs_per_prompt != 1:
            raise ValueError(f"num_outputs_per_prompt: {p.num_outputs_per_prompt}; a video request makes one video "
                             "(send several requests: they share the forwards)")
        if p.guidance_scale_2 is not None and self.boundary is None:
            raise ValueError("guidance_scale_2: this model has no low-noise expert (boundary_ratio is not set)")
        job.extra["max_sequence_length"] = p.max_sequence_length or MAX_SEQUENCE_LENGTH
        job.rows = 1

    def batch_key(self, job: DiffusionJob) -> Hashable:
        # dense latents, and no text mask in the DiT: the UMT5 length must match inside a batch too
        return ("wan", job.height, job.width, self.latent_frames(job), job.extra["max_sequence_length"])

    def latent_frames(self, job: DiffusionJob) -> int:
        return (job.extra["num_frames"] - 1) // self.pipe.vae_scale_factor_temporal + 1

    # ------------------------------------------------------------- preparation

    def _embed(self, prompts: list[str], msl: int) -> torch.Tensor:
        embeds, _ = self.pipe.encode_prompt(prompt=prompts, do_classifier_free_guidance=False, num_videos_per_prompt=1,
                                            max_sequence_length=msl, device=self.device)
        return embeds.to(self.model_dtype)

    def encode(self, jobs: list[DiffusionJob]) -> None:
        msl = jobs[0].extra["max_sequence_length"]
        embeds = self._embed([j.prompt for j in jobs], msl)
        for i, j in enumerate(jobs):
            j.cond = {"encoder_hidden_states": embeds[i:i + 1]}
        cfg = [j for j in jobs if j.do_cfg]
        if cfg:
            # diffusers encodes the negatives in their own call, "" standing in for a missing one
            embeds = self._embed([j.negative_prompt or "" for j in cfg], msl)
            for i, j in enumerate(cfg):
                j.uncond = {"encoder_hidden_states": embeds[i:i + 1]}

    def timesteps(self, job: DiffusionJob) -> None:
        state = self.sampler.make_state(job.params.num_inference_steps, device=self.device)
        if hasattr(state.scheduler, "set_begin_index"):
            state.scheduler.set_begin_index(0)  # as the pipeline does before its loop
        job.sampler_state = state
        if self.boundary is not None and job.do_cfg:
            g = job.params.guidance_scale
            g2 = job.params.guidance_scale_2 if job.params.guidance_scale_2 is not None else g
            job.step_guidance = [g if t >= self.boundary else g2 for t in state.timesteps.tolist()]

    def init_latents(self, job: DiffusionJob) -> None:
        from diffusers.utils.torch_utils import randn_tensor

        f = self.pipe.vae_scale_factor_spatial
        shape = (job.rows, self.in_channels, self.latent_frames(job), job.height // f, job.width // f)
        # the pipeline keeps latents in fp32 whatever the model dtype
        job.latents = randn_tensor(shape, generator=job.generator, device=self.device, dtype=torch.float32)

    # ------------------------------------------------------------- the batched parts

    def model_input(self, x: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return x  # image-to-video appends its first-frame condition channels

    def _forward(self, model: Any, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.pipe.config.expand_timesteps:
            # Wan2.2 TI2V: one timestep per latent token (all equal for text-to-video)
            seq = x.shape[2] * (x.shape[3] // self.patch[1]) * (x.shape[4] // self.patch[2])
            t = t.to(torch.float32)[:, None].expand(-1, seq)
        return model(hidden_states=self.model_input(x, cond).to(self.model_dtype), timestep=t,
                     encoder_hidden_states=cond["encoder_hidden_states"],
                     encoder_hidden_states_image=cond.get("encoder_hidden_states_image"), return_dict=False)[0]

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.boundary is None:
            return self._forward(self.pipe.transformer, x, t, cond)
        # Wan2.2 A14B: rows at high noise go to `transformer`, the rest to `transformer_2`
        high = t >= self.boundary
        if bool(high.all()):
            return self._forward(self.pipe.transformer, x, t, cond)
        if not bool(high.any()):
            return self._forward(self.pipe.transformer_2, x, t, cond)
        out = None
        for model, idx in ((self.pipe.transformer, high.nonzero().squeeze(1)),
                           (self.pipe.transformer_2, (~high).nonzero().squeeze(1))):
            part = self._forward(model, x[idx], t[idx], {k: v[idx] for k, v in cond.items()})
            out = part.new_empty((x.shape[0], *part.shape[1:])) if out is None else out
            out.index_copy_(0, idx, part)
        return out

    def decode(self, jobs: list[DiffusionJob]) -> list[list[np.ndarray]]:
        vae = self.pipe.vae
        latents = torch.cat([j.latents for j in jobs]).to(self.device, dtype=vae.dtype)
        z = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
        frames = self.pipe.video_processor.postprocess_video(video, output_type="np")  # [B, T, H, W, 3] in [0, 1]
        frames = (frames * 255).round().astype(np.uint8)  # the rounding diffusers uses for PIL output
        return [[np.ascontiguousarray(frames[i])] for i in range(len(jobs))]

    def pack_output(self, job: DiffusionJob, decoded: list[np.ndarray]) -> dict[str, Any]:
        return {"video": decoded[0], "fps": job.params.fps or DEFAULT_FPS}
