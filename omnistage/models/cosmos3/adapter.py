"""Cosmos3 (``Cosmos3OmniPipeline``) for the diffusion engine: text -> image, text / image / video -> video (with
sound on request), and the action tasks of its world model (``policy``: video and actions from a first frame;
``forward_dynamics``: video from a first frame and given actions; ``inverse_dynamics``: actions from frames).

Mirrors ``Cosmos3OmniPipeline.__call__`` step by step so that one request alone reproduces it: the prompt
(with the pipeline's resolution / duration sentences and system prompt) tokenized into the joint sequence, the
initial noise and conditioning drawn by the pipeline's own ``prepare_latents`` with the request's generator
(vision, then sound, then actions), one transformer call per CFG pass over the packed text + vision (+ sound)
(+ action) sequence, and one UniPC scheduler copy per modality (UniPC keeps the previous steps' outputs, so each
request and each of its modalities steps its own copy, as diffusers does).

Batching: requests of one latent layout share every step boundary, but each row is its own transformer call.
Cosmos3's transformer takes one packed sequence with no batch axis (causal text and full generation attention
over the whole sequence), so two requests cannot share a forward without rewriting its attention with masks.
A request's modalities travel as one flat latent row (vision, sound, actions) that the sampler splits again.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.input_checks import refuse_params
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter
from omnistage.stages.diffusion.samplers import SchedulerSampler

# Cosmos3OmniPipeline.__call__'s own defaults (tests check they still agree)
DEFAULT_NUM_FRAMES = 189
DEFAULT_HEIGHT = 720
DEFAULT_WIDTH = 1280
DEFAULT_FPS = 24
TASKS = ("policy", "forward_dynamics", "inverse_dynamics")
# the action tasks' own request parameters (extra_body), with the pipeline's defaults where it has one
ACTION_PARAMS = ("action_domain", "action_chunk_size", "actions", "resolution_tier", "view_point")


@dataclass
class Cosmos3Job(DiffusionJob):
    """A request's Cosmos3 state: its sizes (validate), its packed sequences (encode / init_latents) and the
    layout of its flat latent row."""

    num_frames: int = 0
    fps: float = float(DEFAULT_FPS)
    sound: bool = False
    cond_ids: list[int] = field(default_factory=list)
    uncond_ids: list[int] = field(default_factory=list)
    kinds: tuple[str, ...] = ()  # the modalities of its latent row, in order: vision, then sound / action
    shapes: tuple[tuple[int, ...], ...] = ()  # vision [1, C, T, H, W], sound [C, T], action [steps, width]
    schedulers: dict[str, Any] = field(default_factory=dict)  # sound's and action's own UniPC copies
    video: Any = None  # video-to-video / inverse dynamics: the conditioning frames
    action: Any = None  # the action tasks: diffusers' CosmosActionCondition
    raw_action_dim: int | None = None  # the domain's action width (the padded rest stays zero)
    noisy_action: bool = False  # whether the actions are denoised (policy, inverse dynamics)


def split_row(row: torch.Tensor, shapes: tuple[tuple[int, ...], ...]) -> list[torch.Tensor]:
    """One flat latent row -> its modality tensors (vision, then sound / actions)."""
    sizes = [int(np.prod(s)) for s in shapes]
    return [p.reshape(s) for p, s in zip(torch.split(row, sizes), shapes)]


def join_row(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.reshape(-1) for p in parts]).unsqueeze(0)


class Cosmos3Sampler(SchedulerSampler):
    """UniPC per request and per modality: the vision part of a row steps the request's scheduler copy, the sound
    and action parts their own copies, each shaped as diffusers steps it (a leading batch axis added). Actions
    given as conditioning (forward dynamics) are not stepped; the padding past the domain's width stays zero."""

    def scale_model_input(self, x: torch.Tensor, jobs: list[DiffusionJob]) -> torch.Tensor:
        return x  # UniPC does not scale its input

    def step(self, out: torch.Tensor, x: torch.Tensor, jobs: list[Cosmos3Job]) -> torch.Tensor:
        rows = []
        for o, s, j in zip(self._split(out, jobs), self._split(x, jobs), jobs):
            t = self.timestep(j)
            stepped = []
            for kind, v, lat in zip(j.kinds, split_row(o[0], j.shapes), split_row(s[0], j.shapes)):
                if kind == "action" and not j.noisy_action:
                    stepped.append(lat)
                    continue
                sched = j.sampler_state.scheduler if kind == "vision" else j.schedulers[kind]
                lat = sched.step(v.unsqueeze(0), t, lat.unsqueeze(0), return_dict=False)[0].squeeze(0)
                if kind == "action" and j.raw_action_dim is not None:
                    lat[:, j.raw_action_dim :] = 0
                stepped.append(lat)
            rows.append(join_row(stepped))
        return torch.cat(rows)


class Cosmos3Adapter(DiffusersAdapter):
    job_class = Cosmos3Job
    pipeline_class_name = "Cosmos3OmniPipeline"

    @classmethod
    def pipeline_kwargs(cls, folder: str) -> dict[str, Any]:
        # the released folders ask for the Cosmos guardrail (a separate package, which the engine does not run:
        # docs/families/cosmos3.md); without this, loading them needs that package installed
        return {"enable_safety_checker": False, "safety_checker": None}

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.sampler = Cosmos3Sampler(pipe.scheduler)
        self.sample_rate = pipe.sound_tokenizer.config.sampling_rate if pipe.sound_tokenizer is not None else None

    # ------------------------------------------------------------- request checks

    def validate(self, job: Cosmos3Job) -> None:
        p = job.params
        extra = p.extra_args
        image_only = job.wanted is not None and "image" in job.wanted and "video" not in job.wanted
        job.video = self._input_video(job)
        if job.images and len(job.images) != 1:
            raise InvalidRequestError("multi_modal_data.image", f"expected one first frame, got {len(job.images)}")
        if job.images and job.video is not None:
            raise InvalidRequestError("multi_modal_data.video", "send a first frame or a video, not both")
        if p.num_outputs_per_prompt != 1:
            raise InvalidRequestError("num_outputs_per_prompt", "Cosmos3 makes one output per request")
        if p.strength is not None:
            raise InvalidRequestError("strength", "not used by Cosmos3")
        job.cfg = p.guidance_scale != 1.0  # diffusers' rule here: CFG for any scale but 1
        task = extra.get("task")
        if task is not None:
            self._validate_action(job, task)
            return
        for name in ACTION_PARAMS:
            if name in extra:
                raise InvalidRequestError(name, f"only for the action tasks (task: {', '.join(TASKS)})")
        frames = 1 if image_only and p.num_frames is None else p.num_frames or DEFAULT_NUM_FRAMES
        if image_only and frames != 1:
            raise InvalidRequestError("num_frames", "an image is one frame")
        if frames == 1 and (job.images or job.video is not None):
            what = "multi_modal_data.image" if job.images else "multi_modal_data.video"
            raise InvalidRequestError(what, "text-to-image takes no input; ask for a video (num_frames > 1)")
        latent_frames = (frames - 1) // self.pipe.vae_scale_factor_temporal + 1
        if job.video is not None and latent_frames < 2:  # diffusers keeps its first two latent frames clean
            raise InvalidRequestError(
                "num_frames",
                f"video-to-video keeps two latent frames of the input: ask for at least "
                f"{self.pipe.vae_scale_factor_temporal + 1} frames",
            )
        job.num_frames = frames
        job.fps = float(p.fps or DEFAULT_FPS)
        m = self.pipe.vae_scale_factor_spatial
        for name, default in (("height", DEFAULT_HEIGHT), ("width", DEFAULT_WIDTH)):
            value = getattr(p, name) or default
            if value % m:
                raise InvalidRequestError(name, f"{value} is not divisible by {m} (the VAE's spatial factor)")
            setattr(job, name, int(value))
        sound = extra.get("enable_sound", False)
        if sound and (self.sample_rate is None or not self.pipe.transformer.config.sound_gen):
            raise InvalidRequestError("enable_sound", "this checkpoint has no sound head / sound tokenizer")
        if sound and frames == 1:
            raise InvalidRequestError("enable_sound", "an image has no sound; ask for a video (num_frames > 1)")
        job.sound = bool(sound)

    def _input_video(self, job: Cosmos3Job) -> list[Any] | None:
        """``multi_modal_data.video``: the conditioning clip, a list of frames (PIL or uint8 HxWx3)."""
        mm = job.inputs.get("multi_modal_data") or {}
        video = mm.get("video") if isinstance(mm, dict) else None
        if video is None:
            return None
        frames = list(video) if isinstance(video, (list, tuple)) else list(np.asarray(video))
        if not frames:
            raise InvalidRequestError("multi_modal_data.video", "empty video")
        for i, f in enumerate(frames):
            arr = np.asarray(f)
            if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[-1] != 3:
                raise InvalidRequestError(f"multi_modal_data.video[{i}]", "expected an RGB frame (PIL or uint8 HxWx3)")
        return [np.asarray(f) for f in frames]

    def _validate_action(self, job: Cosmos3Job, task: Any) -> None:
        """An action task: its inputs checked by name, then diffusers' own ``CosmosActionCondition``."""
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
            _EMBODIMENT_TO_RAW_ACTION_DIM,
            CosmosActionCondition,
        )

        p, extra = job.params, job.params.extra_args
        if task not in TASKS:
            raise InvalidRequestError("task", f"{task!r} is not one of {', '.join(TASKS)}")
        if not self.pipe.transformer.config.action_gen:
            raise InvalidRequestError("task", "this checkpoint has no action head (action_gen)")
        refuse_params(  # the chunk and the resolution tier size an action run
            p,
            ("num_frames", "height", "width"),
            "not used by the action tasks (action_chunk_size and resolution_tier set the frames and the size)",
        )
        if task == "inverse_dynamics" and job.video is None:
            raise InvalidRequestError("multi_modal_data.video", "inverse_dynamics infers actions from a video")
        if task != "inverse_dynamics" and not job.images and job.video is None:
            raise InvalidRequestError("multi_modal_data.image", f"{task} starts from a first frame")
        domain = extra.get("action_domain")
        if domain not in _EMBODIMENT_TO_RAW_ACTION_DIM:
            raise InvalidRequestError(
                "action_domain", f"{domain!r} is not one of {', '.join(sorted(_EMBODIMENT_TO_RAW_ACTION_DIM))}"
            )
        width = _EMBODIMENT_TO_RAW_ACTION_DIM[domain]
        if width > self.pipe.transformer.config.action_dim:
            raise InvalidRequestError(
                "action_domain", f"its actions are {width} wide, more than this checkpoint's action_dim"
            )
        chunk = extra.get("action_chunk_size")
        if not isinstance(chunk, int) or chunk < 1:
            raise InvalidRequestError("action_chunk_size", "the number of action steps (>= 1) is required")
        raw = None
        if task == "forward_dynamics":
            given = extra.get("actions")
            if not given:
                raise InvalidRequestError("actions", "forward_dynamics rolls out given actions: [[...], ...]")
            bad = [i for i, a in enumerate(given) if len(a) != width]
            if bad:
                raise InvalidRequestError(
                    "actions", f"step {bad[0]} has {len(given[bad[0]])} values; domain {domain!r} takes {width}"
                )
            raw = torch.tensor(given, dtype=torch.float32)
        elif "actions" in extra:
            raise InvalidRequestError("actions", f"only forward_dynamics takes actions; {task} predicts them")
        tier = extra.get("resolution_tier", 480)
        view = extra.get("view_point", "ego_view")
        try:
            job.action = CosmosActionCondition(
                mode=task,
                chunk_size=chunk,
                domain_name=domain,
                resolution_tier=tier,
                raw_actions=raw,
                image=job.images[0] if job.images else None,
                video=job.video if not job.images else None,
                view_point=view,
            )
        except ValueError as e:
            raise InvalidRequestError("resolution_tier", str(e)) from None
        job.raw_action_dim = width
        job.noisy_action = task != "forward_dynamics"
        job.num_frames = chunk + 1
        job.fps = float(p.fps or DEFAULT_FPS)
        sound = bool(extra.get("enable_sound", False))
        if sound and (self.sample_rate is None or not self.pipe.transformer.config.sound_gen):
            raise InvalidRequestError("enable_sound", "this checkpoint has no sound head / sound tokenizer")
        job.sound = sound
        # the canvas the prompt names (``__call__`` probes the input for it before tokenizing)
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _ACTION_RESOLUTION_BINS
        from diffusers.video_processor import VideoProcessor

        clip = [job.action.image] if job.action.image is not None else job.action.video
        probe = self.pipe.video_processor.preprocess_video(clip)
        job.height, job.width = VideoProcessor.classify_height_width_bin(
            int(probe.shape[-2]), int(probe.shape[-1]), ratios=_ACTION_RESOLUTION_BINS[str(tier)]
        )

    def batch_key(self, job: Cosmos3Job) -> Hashable:
        # requests whose latent rows have one length (the shapes are known once the inputs are encoded: an
        # action run's video latents are cropped to its input's content)
        inputs = None
        if job.images:
            inputs = job.images[0].size
        elif job.video is not None:
            inputs = (len(job.video), job.video[0].shape)
        task = job.action.mode if job.action is not None else None
        return ("cosmos3", job.num_frames, job.height, job.width, job.sound, task, job.raw_action_dim, inputs)

    # ------------------------------------------------------------- prompts and latents

    def encode(self, jobs: list[Cosmos3Job]) -> None:
        for j in jobs:  # token ids only: the joint transformer embeds them itself at every step
            j.cond_ids, j.uncond_ids = self.pipe.tokenize_prompt(
                j.prompt,
                j.negative_prompt,
                num_frames=j.num_frames,
                height=j.height,
                width=j.width,
                fps=j.fps,
                action_mode=j.action.mode if j.action is not None else None,
                action_view_point=j.action.view_point if j.action is not None else None,
            )

    def timesteps(self, job: Cosmos3Job) -> None:
        job.sampler_state = self.sampler.make_state(job.params.num_inference_steps, device=self.device)
        extra = (["sound"] if job.sound else []) + (["action"] if job.action is not None else [])
        job.schedulers = {kind: copy.deepcopy(job.sampler_state.scheduler) for kind in extra}

    def init_latents(self, job: Cosmos3Job) -> None:
        pipe = self.pipe
        action = job.action
        (latents, sound, actions, fps_vision, fps_sound, vision_mask, sound_mask, action_mask, domain_id, _, raw_dim,
         action_frames) = pipe.prepare_latents(
            image=job.images[0] if job.images and action is None else None,
            video=job.video if action is None else None,
            num_frames=job.num_frames,
            height=job.height,
            width=job.width,
            fps=job.fps,
            generator=job.generator,
            device=self.device,
            dtype=torch.float32,
            enable_sound=job.sound,
            action=action,
        )  # fmt: skip
        kinds = ["vision"] + (["sound"] if sound is not None else []) + (["action"] if actions is not None else [])
        parts = [latents] + [x for x in (sound, actions) if x is not None]
        job.kinds, job.shapes = tuple(kinds), tuple(tuple(x.shape) for x in parts)
        job.latents = join_row(parts)
        static = dict(
            kinds=job.kinds,
            shapes=job.shapes,
            vision_mask=vision_mask,
            sound_mask=sound_mask,
            action_mask=action_mask,
            domain_id=domain_id,
            raw_action_dim=raw_dim,
        )
        modal = (latents, sound, actions, fps_vision, fps_sound, vision_mask, action_frames)
        job.cond = {"pack": self._pack(job.cond_ids, *modal) | static}
        if job.do_cfg:
            job.uncond = {"pack": self._pack(job.uncond_ids, *modal) | static}

    def _pack(
        self, ids: list[int], latents, sound, actions, fps_vision, fps_sound, vision_mask, action_frames
    ) -> dict[str, Any]:
        """The static part of one prompt's joint sequence (``__call__``'s step 5)."""
        pipe, device = self.pipe, self.device
        text = pipe._prepare_text_segment(ids, device=device)
        conditioned = [int(i) for i in torch.nonzero(vision_mask[:, 0, 0] > 0, as_tuple=False).flatten()]
        vision = pipe._prepare_vision_segment(
            input_vision_tokens=latents,
            has_image_condition=bool(conditioned),
            mrope_offset=text["vision_start_temporal_offset"],
            vision_fps=fps_vision,
            curr=text["und_len"],
            device=device,
            condition_frame_indexes=conditioned,
        )
        snd: dict[str, Any] = {}
        if sound is not None:
            snd = pipe._prepare_sound_segment(
                input_sound_tokens=sound,
                mrope_offset=text["vision_start_temporal_offset"],
                sound_fps=fps_sound,
                curr=text["und_len"] + vision["num_vision_tokens"],
                device=device,
            )
        act: dict[str, Any] = {}
        if actions is not None:
            act = pipe._prepare_action_segment(
                input_action_tokens=actions,
                condition_frame_indexes=action_frames,
                mrope_offset=text["vision_start_temporal_offset"],
                action_fps=fps_vision,
                curr=text["und_len"] + vision["num_vision_tokens"] + snd.get("sound_len", 0),
                device=device,
            )
        mrope = [text["text_mrope_ids"], vision["vision_mrope_ids"]]
        mrope += ([snd["sound_mrope_ids"]] if snd else []) + ([act["action_mrope_ids"]] if act else [])
        return {
            **text,
            **vision,
            **snd,
            **act,
            "position_ids": torch.cat(mrope, dim=1),
            "sequence_length": text["und_len"]
            + vision["num_vision_tokens"]
            + snd.get("sound_len", 0)
            + act.get("action_len", 0),
        }

    # ------------------------------------------------------------- the denoiser

    def collate(self, conds: list[dict[str, Any]]) -> dict[str, Any]:
        return {"packs": [c["pack"] for c in conds]}  # one packed sequence per row: no tensor to concatenate

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, Any]) -> torch.Tensor:
        return torch.cat([self._predict_row(row, ti, pack) for row, ti, pack in zip(x, t, cond["packs"])])

    def _predict_row(self, row: torch.Tensor, t: torch.Tensor, pack: dict[str, Any]) -> torch.Tensor:
        device, dtype = self.device, self.pipe.transformer.dtype
        parts = dict(zip(pack["kinds"], split_row(row, pack["shapes"])))
        vision = parts["vision"].to(device=device, dtype=dtype)
        sound = parts["sound"].to(device=device, dtype=dtype) if "sound" in parts else None
        action = parts["action"].to(device=device, dtype=dtype) if "action" in parts else None
        timestep = t.item()  # diffusers fills each modality's timesteps from the Python number
        preds_vision, preds_sound, preds_action = self.pipe.transformer(
            input_ids=pack["input_ids"],
            text_indexes=pack["text_indexes"],
            position_ids=pack["position_ids"],
            und_len=pack["und_len"],
            sequence_length=pack["sequence_length"],
            vision_tokens=[vision],
            vision_token_shapes=pack["vision_token_shapes"],
            vision_sequence_indexes=pack["vision_sequence_indexes"],
            vision_mse_loss_indexes=pack["vision_mse_loss_indexes"],
            vision_timesteps=torch.full((pack["num_noisy_vision_tokens"],), timestep, device=device),
            vision_noisy_frame_indexes=pack["vision_noisy_frame_indexes"],
            sound_tokens=[sound] if sound is not None else None,
            sound_token_shapes=pack.get("sound_token_shapes"),
            sound_sequence_indexes=pack.get("sound_sequence_indexes"),
            sound_mse_loss_indexes=pack.get("sound_mse_loss_indexes"),
            sound_timesteps=torch.full((pack["sound_len"],), timestep, device=device) if sound is not None else None,
            sound_noisy_frame_indexes=pack.get("sound_noisy_frame_indexes"),
            action_tokens=[action] if action is not None else None,
            action_token_shapes=pack.get("action_token_shapes"),
            action_sequence_indexes=pack.get("action_sequence_indexes"),
            action_mse_loss_indexes=pack.get("action_mse_loss_indexes"),
            action_timesteps=(
                torch.full((pack["num_noisy_action_tokens"],), timestep, device=device) if action is not None else None
            ),
            action_noisy_frame_indexes=pack.get("action_noisy_frame_indexes"),
            action_domain_ids=[pack["domain_id"]] if action is not None else None,
            return_dict=False,
        )
        v_vision, v_sound, v_action = self.pipe._mask_velocity_predictions(
            preds_vision,
            preds_sound,
            vision_condition_mask=[pack["vision_mask"]],
            sound_condition_mask=[pack["sound_mask"]] if pack["sound_mask"] is not None else None,
            preds_action=preds_action,
            action_condition_mask=[pack["action_mask"]] if pack["action_mask"] is not None else None,
            raw_action_dim=pack["raw_action_dim"],
        )
        if v_action is None and action is not None:  # (diffusers steps no action then: any value is kept)
            v_action = torch.zeros_like(action)
        return join_row([v.float() for v in (v_vision, v_sound, v_action) if v is not None])

    # ------------------------------------------------------------- output

    def decode(self, jobs: list[Cosmos3Job]) -> list[list[Any]]:
        """Each request decoded alone (as diffusers decodes it: a batched VAE call rounds differently)."""
        pipe, out = self.pipe, []
        vae_dtype = pipe.vae.dtype
        for j in jobs:
            parts = dict(zip(j.kinds, split_row(j.latents[0], j.shapes)))
            latents = parts["vision"]
            mean = pipe._vae_latents_mean.to(device=latents.device, dtype=vae_dtype)
            inv_std = pipe._vae_latents_inv_std.to(device=latents.device, dtype=vae_dtype)
            z_raw = latents.to(vae_dtype) / inv_std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)
            decoded = pipe.vae.decode(z_raw).sample.to(latents.dtype)
            frames = pipe.video_processor.postprocess_video(decoded, output_type="np")[0]  # [T, H, W, 3] in [0, 1]
            frames = (frames * 255).round().astype(np.uint8)  # the rounding diffusers uses for PIL output
            sound = pipe.decode_sound(parts["sound"]).float().cpu() if j.sound else None
            actions = None
            if j.noisy_action:  # policy and inverse dynamics predict the actions; forward dynamics was given them
                actions = parts["action"][:, : j.raw_action_dim].detach().cpu()
            out.append([frames, sound, actions])
        return out

    def pack_output(self, job: Cosmos3Job, decoded: list[Any]) -> dict[str, Any]:
        frames, sound, actions = decoded
        if job.num_frames == 1 and (job.wanted is None or "image" in job.wanted):
            return {"image": [np.ascontiguousarray(frames[0])]}
        out: dict[str, Any] = {"video": frames, "fps": job.fps}
        if sound is not None:
            out["audio"], out["sample_rate"] = sound, self.sample_rate
        if actions is not None:  # one action per frame transition: the video's frame rate
            out["action"], out["action_domain"], out["action_fps"] = actions, job.action.domain_name, job.fps
        return out
