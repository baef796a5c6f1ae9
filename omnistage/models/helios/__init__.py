"""Helios text-, image- and video-to-video: one diffusion stage (UMT5 -> HeliosTransformer3DModel, chunk after
chunk on its own history -> Wan VAE), and its pyramid variant (resolution stages inside every chunk)."""

from omnistage.info import PipelineInfo
from omnistage.models.helios.adapter import CALL_NUM_FRAMES, DEFAULT_FPS, DEFAULT_STEPS, HeliosAdapter, frames_made
from omnistage.models.helios.pyramid import DEFAULT_STAGE_STEPS, HeliosPyramidAdapter
from omnistage.models.helios.tiny import build, build_pyramid
from omnistage.models.shared.diffusers_family import diffusers_pipeline

# the frames diffusers' default request (132) makes: whole chunks of 33, trimmed to 4k+1
DEFAULT_NUM_FRAMES = frames_made(CALL_NUM_FRAMES, 4)


def _defaults(steps: int) -> dict:
    # HeliosPipeline.__call__'s defaults (and the pyramid's: 10 steps per stage)
    return {"num_inference_steps": steps, "num_frames": DEFAULT_NUM_FRAMES, "guidance_scale": 5.0, "fps": DEFAULT_FPS}


# an image (the first frame) or a video (continued) may seed the video: /v1/videos takes either
INFO = PipelineInfo(video_input=True)

PIPELINE = diffusers_pipeline(
    __file__,
    "helios",
    "Helios text-, image- and video-to-video: UMT5 -> HeliosTransformer3DModel (chunks of 33 frames "
    "on multi-term history, UniPC) -> AutoencoderKLWan",
    classes="HeliosPipeline",
    adapter=HeliosAdapter,
    output="video",
    defaults=_defaults(DEFAULT_STEPS),
    info=INFO,
)

PYRAMID = diffusers_pipeline(
    __file__,
    "helios_pyramid",
    "Helios pyramid text-, image- and video-to-video: as helios, each chunk denoised in resolution "
    "stages (num_inference_steps per stage)",
    classes="HeliosPyramidPipeline",
    adapter=HeliosPyramidAdapter,
    output="video",
    defaults=_defaults(DEFAULT_STAGE_STEPS),
    info=INFO,
)

PIPELINES = [PIPELINE, PYRAMID]
TINY = {"helios": build, "helios_pyramid": build_pyramid}

__all__ = ["HeliosAdapter", "HeliosPyramidAdapter", "PIPELINE", "PIPELINES", "PYRAMID", "TINY"]
