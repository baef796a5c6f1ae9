"""LTX-2 text- and image-to-video with sound: one diffusion stage (Gemma 3 -> text connectors -> audio-video DiT ->
video VAE, audio VAE + vocoder) whose output is ``video+audio``. LTX-2.0 and LTX-2.3 folders alike: the 2.3 layout
differs only in component configs (per-modality connectors, prompt modulation, a bandwidth-extending vocoder),
which diffusers' classes read themselves."""

from pathlib import Path

from omnistage.models.ltx2.adapter import DEFAULT_FPS, DEFAULT_NUM_FRAMES, EXTRA_PARAMS, LTX2Adapter
from omnistage.models.ltx2.tiny import build, build_i2v, build_v23
from omnistage.pipeline import Pipeline, StageSpec

DEPLOY = Path(__file__).with_name("deploy.yaml")  # the family's default deployment

LTX2_CLASSES = {"LTX2Pipeline", "LTX2ImageToVideoPipeline"}

PIPELINE = Pipeline(
    name="ltx2",
    description="LTX-2 text/image-to-video with audio: Gemma3 -> LTX2VideoTransformer3DModel (flow Euler) -> "
    "AutoencoderKLLTX2Video + AutoencoderKLLTX2Audio + vocoder",
    matches=lambda f: f.diffusers_class in LTX2_CLASSES,
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            adapter=LTX2Adapter,
            output="video+audio",
            can_output="video,audio,latent",
            final=True,
            # LTX2Pipeline.__call__'s defaults (frame_rate is its fps)
            default_params={
                "num_inference_steps": 30,
                "guidance_scale": 3.0,
                "num_frames": DEFAULT_NUM_FRAMES,
                "fps": DEFAULT_FPS,
            },
        )
    ],
    extra_body_params=EXTRA_PARAMS,
    deploy_file=DEPLOY,
)

PIPELINES = [PIPELINE]
TINY = {"ltx2": build, "ltx2_i2v": build_i2v, "ltx23": build_v23}  # ltx23: the LTX-2.3 layout

__all__ = ["LTX2Adapter", "PIPELINE", "PIPELINES", "TINY"]
