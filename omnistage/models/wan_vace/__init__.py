"""Wan VACE: one diffusion stage (UMT5 -> WanVACETransformer3DModel, its hints from a source video, a mask and
reference pictures -> Wan video VAE): inpainting, outpainting, control videos and reference-to-video."""

from omnistage.info import PipelineInfo
from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.models.shared.wan_adapter import DEFAULT_FPS
from omnistage.models.wan_vace.adapter import WanVaceAdapter
from omnistage.models.wan_vace.tiny import build

PIPELINE = diffusers_pipeline(
    __file__,
    "wan_vace",
    "Wan VACE: UMT5 -> WanVACETransformer3DModel (hints of a video, its mask, reference pictures; "
    "UniPC flow) -> AutoencoderKLWan",
    classes="WanVACEPipeline",
    adapter=WanVaceAdapter,
    output="video",
    # WanVACEPipeline.__call__'s defaults; size and frames default to the source video's (adapter.py)
    defaults={"num_inference_steps": 50, "guidance_scale": 5.0, "fps": DEFAULT_FPS},
    # one value for every VACE layer, or one per layer
    extra_body_params={"conditioning_scale": float | list[float]},
    info=PipelineInfo(video_input=True, video_mask=True),
)

PIPELINES = [PIPELINE]
TINY = {"wan_vace": build}

__all__ = ["WanVaceAdapter", "PIPELINE", "PIPELINES", "TINY"]
