"""Helios text-, image- and video-to-video (UMT5 text, a 3-D DiT conditioned on multi-term history latents, the Wan
video VAE) for the diffusion engine (an input image or video seeds the history: conditioning.py).

Helios makes a video in chunks of ``CHUNK_LATENT_FRAMES`` latent frames, one after another: each chunk starts from
fresh noise, runs the whole schedule, and is conditioned on the latents made so far (the last 16 + 2 + 1 latent
frames as long / mid / short history, the video's first latent frame as the short history's prefix). Here each
engine step is one denoising step of a request's current chunk; at the chunk's last step ``after_step`` folds the
chunk into the request's history and starts the next one. The batch key (size, text length) is the same for every
chunk, so requests at different chunks, and of different lengths, share forwards step by step.

Mirrors ``HeliosPipeline.__call__`` so that one request alone reproduces it exactly: fp32 noise per chunk from the
request's generator, the folder's HeliosScheduler restarted per chunk, cond and uncond as separate forwards,
``u + g * (c - u)``, and each chunk decoded by its own VAE call.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.helios.conditioning import IMAGE, VIDEO, InputLatents, image_latents, input_video, video_latents
from omnistage.models.shared.input_checks import refuse_params
from omnistage.models.shared.video_frames import check_one_video
from omnistage.models.shared.wan_adapter import umt5_embeds
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter
from omnistage.stages.diffusion.samplers import SamplerState, SchedulerSampler

# HeliosPipeline.__call__'s own defaults (tests check they still agree)
DEFAULT_HEIGHT = 384
DEFAULT_WIDTH = 640
CALL_NUM_FRAMES = 132  # diffusers' default request; it makes 4 chunks, trimmed to 129 frames
DEFAULT_STEPS = 50
MAX_SEQUENCE_LENGTH = 512
HISTORY_SIZES = (16, 2, 1)  # long, mid, short history latent frames
CHUNK_LATENT_FRAMES = 9
DEFAULT_FPS = 24  # what the Helios examples export at


@dataclass
class PhaseState(SamplerState):
    """The sampler state of one phase (a chunk, or a pyramid stage of one): the scheduler restarts per phase,
    while ``job.step`` counts the request's steps over all of them (for progress)."""

    first_step: int = 0  # the request's step count when this phase began
    total: int = 0  # the request's steps over all phases

    @property
    def num_steps(self) -> int:
        return self.total


class PhaseSampler(SchedulerSampler):
    """Each request steps through its own scheduler copy (HeliosScheduler's UniPC keeps history), indexed from
    its phase's first step. HeliosScheduler scales no model input."""

    def timestep(self, job: HeliosJob) -> torch.Tensor:
        s = job.sampler_state
        return s.timesteps[job.step - s.first_step]

    def scale_model_input(self, x: torch.Tensor, jobs: list[HeliosJob]) -> torch.Tensor:
        return x

    def phase_done(self, job: HeliosJob) -> bool:
        s = job.sampler_state
        return job.step - s.first_step >= len(s.timesteps)


@dataclass
class HeliosRun:
    """One request's progress through its chunks (``HeliosJob.run``)."""

    chunks: int
    chunk: int = 0
    history: torch.Tensor | None = None  # fp32 [1, C, T, h, w]: zeros, then every finished chunk appended
    prefix: torch.Tensor | None = None  # the input's first latent frame, else the video's once its first chunk is done
    generated: int = 0  # latent frames made so far
    done: list[torch.Tensor] = field(default_factory=list)  # each finished chunk's latents (decoded one by one)


@dataclass
class HeliosJob(DiffusionJob):
    """A request's Helios state, set in validate."""

    num_frames: int = 0
    max_sequence_length: int = 0
    video: list[Any] | None = None  # video-to-video: the input's frames (PIL)
    run: HeliosRun | None = None


def frames_made(num_frames: int, temporal: int) -> int:
    """The frame count HeliosPipeline returns for a request of ``num_frames``: whole chunks, trimmed to 4k+1."""
    window = (CHUNK_LATENT_FRAMES - 1) * temporal + 1
    chunks = max(1, (num_frames + window - 1) // window)
    return (chunks * window - 1) // temporal * temporal + 1


class HeliosAdapter(DiffusersAdapter):
    pipeline_class_name = "HeliosPipeline"
    job_class = HeliosJob
    separate_cfg_passes = True  # diffusers runs cond and uncond as two forwards
    pyramid: ClassVar[bool] = False

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.sampler = PhaseSampler(pipe.scheduler)
        kind = pipe.scheduler.config.get("scheduler_type")
        if type(pipe.scheduler).__name__ != "HeliosScheduler" or kind not in ("unipc", "euler"):
            raise ValueError(
                f"{type(pipe.scheduler).__name__} (scheduler_type={kind!r}): only HeliosScheduler's "
                "UniPC / Euler sampling is supported (a distilled model's DMD sampling is not yet)"
            )
        self.model_dtype = pipe.transformer.dtype
        self.channels = pipe.transformer.config.in_channels
        self.patch = tuple(pipe.transformer.config.patch_size)
        self.window = (CHUNK_LATENT_FRAMES - 1) * pipe.vae_scale_factor_temporal + 1  # video frames per chunk
        sizes = list(HISTORY_SIZES)
        parts = torch.arange(0, sum([1, *sizes, CHUNK_LATENT_FRAMES])).split([1, *sizes, CHUNK_LATENT_FRAMES])
        prefix, long, mid, x1, hidden = parts  # keep_first_frame: the first frame prefixes the short history
        self.indices = {
            "indices_hidden_states": hidden[None],
            "indices_latents_history_short": torch.cat([prefix, x1])[None],
            "indices_latents_history_mid": mid[None],
            "indices_latents_history_long": long[None],
        }

    # ------------------------------------------------------------- request checks

    def validate(self, job: HeliosJob) -> None:
        p = job.params
        for name, default in (("height", DEFAULT_HEIGHT), ("width", DEFAULT_WIDTH)):
            value = int(getattr(p, name) or default)
            if value % self.size_multiple():
                raise InvalidRequestError(
                    name, f"{value} is not divisible by {self.size_multiple()} ({self.size_rule})"
                )
            setattr(job, name, value)
        frames = self.frames_for(p.num_frames or CALL_NUM_FRAMES, p.nearest_frames)
        check_one_video(p)
        refuse_params(p, ("guidance_scale_2", "true_cfg_scale"), "not used by Helios")
        job.num_frames = frames
        job.video = input_video(job, self.window)
        if job.images and len(job.images) != 1:
            raise InvalidRequestError(IMAGE, f"expected one first frame, got {len(job.images)}")
        if job.images and job.video is not None:  # as HeliosPipeline.check_inputs
            raise InvalidRequestError(VIDEO, "send an image or a video, not both")
        job.max_sequence_length = p.max_sequence_length or MAX_SEQUENCE_LENGTH
        job.run = HeliosRun(chunks=(frames + self.window - 1) // self.window)
        job.rows = 1

    def frames_for(self, asked: int, nearest: bool) -> int:
        """The frames made for ``asked``: HeliosPipeline makes whole chunks (9 -> 33, 34 -> 65); a count the
        server derived from seconds x fps (``nearest``) gets the nearest length Helios makes instead (the longer
        on a tie)."""
        ft = self.pipe.vae_scale_factor_temporal
        made = frames_made(asked, ft)
        if nearest and made > self.window:
            shorter = frames_made(made - self.window, ft)
            if asked - shorter < made - asked:
                return shorter
        return made

    @property
    def size_rule(self) -> str:
        return f"VAE factor {self.pipe.vae_scale_factor_spatial} x patch {self.patch[1]}"

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor_spatial * self.patch[1]

    def batch_key(self, job: HeliosJob) -> Hashable:
        # dense latents and no text mask in the DiT: the UMT5 length must match too; the chunk does not matter
        return ("helios", job.height, job.width, job.max_sequence_length)

    def steps_per_chunk(self, job: HeliosJob) -> int:
        return job.params.num_inference_steps

    # ------------------------------------------------------------- preparation

    def embed(self, prompts: list[str], jobs: list[HeliosJob]) -> dict[str, torch.Tensor]:
        return umt5_embeds(self, prompts, jobs[0].max_sequence_length)

    def timesteps(self, job: HeliosJob) -> None:
        pass  # every chunk sets its own (start_chunk)

    def init_latents(self, job: HeliosJob) -> None:
        f = self.pipe.vae_scale_factor_spatial
        run = job.run
        run.history = torch.zeros(
            1,
            self.channels,
            sum(HISTORY_SIZES),
            job.height // f,
            job.width // f,
            device=self.device,
            dtype=torch.float32,
        )
        given = self.input_latents(job)
        if given is not None:  # the input's latents end the history (all of it when they are longer)
            keep = max(0, run.history.shape[2] - given.history.shape[2])
            run.history = torch.cat([run.history[:, :, :keep], given.history], dim=2)
            run.prefix, run.generated = given.prefix, given.generated
        self.start_chunk(job)

    def input_latents(self, job: HeliosJob) -> InputLatents | None:
        if not job.images and job.video is None:
            return None
        cfg = self.pipe.vae.config
        dtype = self.pipe.vae.dtype
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(self.device, dtype)
        inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(self.device, dtype)
        if job.images:
            return image_latents(self.pipe, job, CHUNK_LATENT_FRAMES, (mean, inv_std), self.device)
        return video_latents(self.pipe, job, job.video, CHUNK_LATENT_FRAMES, (mean, inv_std), self.device)

    def start_chunk(self, job: HeliosJob) -> None:
        """The chunk's history conditioning (as HeliosPipeline slices it), its noise, and its schedule."""
        run = job.run
        long, mid, x1 = run.history[:, :, -sum(HISTORY_SIZES) :].split(list(HISTORY_SIZES), dim=2)
        prefix = (
            run.prefix
            if run.prefix is not None
            else torch.zeros((1, self.channels, 1, x1.shape[-2], x1.shape[-1]), device=self.device, dtype=x1.dtype)
        )
        history = {
            "latents_history_short": torch.cat([prefix, x1], dim=2).to(self.model_dtype),
            "latents_history_mid": mid.to(self.model_dtype),
            "latents_history_long": long.to(self.model_dtype),
            **{k: v.to(self.device) for k, v in self.indices.items()},
        }
        for c in (job.cond, job.uncond):
            if c is not None:
                c.update(history)
        noise = self.pipe.prepare_latents(
            1,
            self.channels,
            job.height,
            job.width,
            self.window,
            dtype=torch.float32,
            device=self.device,
            generator=job.generator,
        )
        self.start_phase(job, noise, chunk_start=True)

    def start_phase(self, job: HeliosJob, noise: torch.Tensor, chunk_start: bool) -> None:
        f = self.pipe.vae_scale_factor_spatial
        seq = CHUNK_LATENT_FRAMES * (job.height // f) * (job.width // f) // int(np.prod(self.patch))
        n = job.params.num_inference_steps
        state = self.sampler.make_state(
            n, device=self.device, sigmas=np.linspace(0.999, 0.0, n + 1)[:-1], mu=self.dynamic_shift_mu(seq)
        )
        self.set_phase(job, state)
        job.latents = noise

    def set_phase(self, job: HeliosJob, state: SamplerState) -> None:
        run = job.run
        job.sampler_state = PhaseState(
            state.scheduler,
            state.timesteps,
            state.begin,
            state.sigmas,
            first_step=job.step,
            total=run.chunks * self.steps_per_chunk(job),
        )

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        # every row of a batch shares the history layout (one batch key): the indices of its first row serve all
        indices = {k: cond[k][:1] for k in self.indices}
        history = {k: cond[k] for k in ("latents_history_short", "latents_history_mid", "latents_history_long")}
        return self.pipe.transformer(
            hidden_states=x.to(self.model_dtype),
            timestep=self.model_timestep(t),
            encoder_hidden_states=cond["encoder_hidden_states"],
            **indices,
            **history,
            return_dict=False,
        )[0]

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def combine_guidance(self, u: torch.Tensor | None, c: torch.Tensor, job: HeliosJob) -> torch.Tensor:
        return u + job.guidance * (c - u)  # HeliosPipeline's expression, in the model dtype

    def after_step(self, jobs: list[HeliosJob]) -> None:
        for j in jobs:
            if self.sampler.phase_done(j):
                self.end_phase(j)

    def end_phase(self, job: HeliosJob) -> None:
        self.end_chunk(job)

    def end_chunk(self, job: HeliosJob) -> None:
        """Fold the finished chunk into the history (HeliosPipeline's order of operations), then start the next
        chunk, or leave the whole video's latents on the job (what ``output_type="latent"`` returns)."""
        run = job.run
        latents = job.latents
        if run.prefix is None:
            run.prefix = latents[:, :, 0:1, :, :]
        run.generated += latents.shape[2]
        run.history = torch.cat([run.history, latents], dim=2)
        run.done.append(run.history[:, :, -latents.shape[2] :])
        run.chunk += 1
        if run.chunk < run.chunks:
            self.start_chunk(job)
        else:
            job.latents = run.history[:, :, -run.generated :]

    def denoisers(self) -> list[torch.nn.Module]:
        return [self.pipe.transformer]

    # ------------------------------------------------------------- output

    def decode(self, jobs: list[HeliosJob]) -> list[list[np.ndarray]]:
        vae = self.pipe.vae
        cfg = vae.config
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(self.device, vae.dtype)
        inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(self.device, vae.dtype)
        out = []
        for j in jobs:  # each chunk its own decode, as the pipeline does (the VAE's causal cache starts afresh)
            run = j.run
            video = torch.cat(
                [vae.decode(c.to(vae.dtype) / inv_std + mean, return_dict=False)[0] for c in run.done], dim=2
            )
            ft = self.pipe.vae_scale_factor_temporal
            video = video[:, :, : (video.size(2) - 1) // ft * ft + 1]
            frames = self.pipe.video_processor.postprocess_video(video, output_type="np")  # [1, T, H, W, 3] in [0, 1]
            out.append([np.ascontiguousarray((frames[0] * 255).round().astype(np.uint8))])
        return out

    def pack_output(self, job: HeliosJob, decoded: list[np.ndarray]) -> dict[str, Any]:
        return {"video": decoded[0], "fps": job.params.fps or DEFAULT_FPS}
