"""An LTX-2 request's checks and the knobs they resolve (``LTX2Pipeline.__call__``'s defaults and its guidance
scales): what the adapters validate before a request joins the loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.video_frames import check_one_video
from omnistage.stages.diffusion.adapter import DiffusionJob, frames_of_form

# LTX2Pipeline.__call__'s own defaults (tests check they still agree)
DEFAULT_HEIGHT = 512
DEFAULT_WIDTH = 768
DEFAULT_NUM_FRAMES = 121
DEFAULT_FPS = 24
MAX_SEQUENCE_LENGTH = 1024
GUIDANCE = {
    "audio_guidance_scale": 7.0,
    "stg_scale": 1.0,
    "audio_stg_scale": 1.0,
    "modality_scale": 3.0,
    "audio_modality_scale": 3.0,
    "guidance_rescale": 0.7,
    "audio_guidance_rescale": 0.7,
}
STG_BLOCKS = (28,)
# the model-specific request keys (extra_body), with their types
EXTRA_PARAMS: dict[str, type] = {
    **{k: float for k in GUIDANCE},
    "spatio_temporal_guidance_blocks": list[int],
    "use_cross_timestep": bool,
    "motion_speed": float,
    "image_crf": int,
}


@dataclass
class LTX2Job(DiffusionJob):
    """A request's LTX-2 state, set in validate (``shapes`` when its latents are drawn)."""

    num_frames: int = 0
    fps: float = 0.0
    scales: dict[str, float] = field(default_factory=dict)  # the video and audio CFG / STG / modality scales
    stg_blocks: tuple[int, ...] = ()  # the blocks spatio-temporal guidance perturbs
    cross: bool = True  # use_cross_timestep
    rope_fps: float = 0.0  # the frame rate RoPE sees (fps / motion_speed)
    max_sequence_length: int = 0
    audio_frames: int = 0  # audio latent frames
    shapes: tuple[tuple[int, int], tuple[int, int]] | None = None  # (tokens, width) of the video and audio latents


def check_video(job: LTX2Job, pipe: Any) -> None:
    """Check a video request against ``pipe`` (an LTX-2 pipeline) and set its resolved sizes, frame counts and
    guidance scales on ``job``."""
    p = job.params
    m = pipe.vae_spatial_compression_ratio * pipe.transformer_spatial_patch_size
    m = max(m, 32)  # LTX2Pipeline.check_inputs: multiples of 32 whatever the VAE
    for name, default in (("height", DEFAULT_HEIGHT), ("width", DEFAULT_WIDTH)):
        value = getattr(p, name) or default
        if value % m:
            raise InvalidRequestError(name, f"{value} is not divisible by {m}")
        setattr(job, name, int(value))
    ft = pipe.vae_temporal_compression_ratio * pipe.transformer_temporal_patch_size
    # as asked, as LTX2Pipeline takes it: its VAE decodes (n - 1) // ft * ft + 1 frames, while the audio's
    # length follows n / fps
    frames = frames_of_form(job, p.num_frames or DEFAULT_NUM_FRAMES, ft)
    check_one_video(p)
    if p.guidance_scale_2 is not None or p.true_cfg_scale is not None:
        name = "guidance_scale_2" if p.guidance_scale_2 is not None else "true_cfg_scale"
        raise InvalidRequestError(name, "not used by LTX-2 (audio_guidance_scale sets the audio's CFG scale)")
    extra = dict(p.extra_args)
    g = float(p.guidance_scale)
    # LTX2Pipeline.__call__: an unset (or zero) audio value falls back to the video one
    scales = {k: float(extra.get(k, v)) for k, v in GUIDANCE.items()}
    for k in GUIDANCE:
        video_key = k.replace("audio_", "")
        if k.startswith("audio_") and not scales[k]:
            scales[k] = g if video_key == "guidance_scale" else scales[video_key]
    scales["guidance_scale"] = g
    blocks = extra.get("spatio_temporal_guidance_blocks", list(STG_BLOCKS))
    if not isinstance(blocks, list) or not all(isinstance(b, int) and 0 <= b for b in blocks):
        raise InvalidRequestError("spatio_temporal_guidance_blocks", "expected a list of block indices")
    if (scales["stg_scale"] > 0 or scales["audio_stg_scale"] > 0) and not blocks:
        raise InvalidRequestError(
            "spatio_temporal_guidance_blocks", "STG is on (stg_scale > 0) but no blocks are given"
        )
    speed = float(extra.get("motion_speed", 1.0))
    if speed <= 0:
        raise InvalidRequestError("motion_speed", f"{speed} must be positive")
    fps = p.fps or DEFAULT_FPS
    job.num_frames, job.fps, job.scales, job.stg_blocks = frames, fps, scales, tuple(blocks)
    job.cross = bool(extra.get("use_cross_timestep", True))
    job.rope_fps = fps / speed
    job.max_sequence_length = p.max_sequence_length or MAX_SEQUENCE_LENGTH
    job.audio_frames = round(
        frames
        / fps
        * pipe.audio_sampling_rate
        / pipe.audio_hop_length
        / float(pipe.audio_vae_temporal_compression_ratio)
    )
    job.cfg = g > 1.0 or scales["audio_guidance_scale"] > 1.0  # diffusers' do_classifier_free_guidance
    job.rows = 1
