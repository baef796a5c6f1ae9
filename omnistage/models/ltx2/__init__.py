"""LTX-2 text- and image-to-video with sound: one diffusion stage (Gemma 3 -> text connectors -> audio-video DiT ->
video VAE, audio VAE + vocoder) whose output is ``video+audio``. LTX-2.0 and LTX-2.3 folders alike: the 2.3 layout
differs only in component configs (per-modality connectors, prompt modulation, a bandwidth-extending vocoder),
which diffusers' classes read themselves."""

from pathlib import Path

from omnistage.modality import AccumulationRule
from omnistage.models.ltx2.adapter import LTX2Adapter
from omnistage.models.ltx2.handoff import one_payload, split_params_for, to_refine_pass
from omnistage.models.ltx2.image_to_video import LTX2I2VAdapter  # (registers itself as LTX2Adapter's I2V variant)
from omnistage.models.ltx2.refine import LTX2FirstPassAdapter, LTX2RefineAdapter
from omnistage.models.ltx2.request import DEFAULT_FPS, DEFAULT_NUM_FRAMES, EXTRA_PARAMS
from omnistage.models.ltx2.tiny import build, build_i2v, build_v23
from omnistage.models.shared.diffusers_family import diffusers_pipeline
from omnistage.pipeline import Edge, Pipeline, StageSpec

PIPELINE = diffusers_pipeline(
    __file__,
    "ltx2",
    "LTX-2 text/image-to-video with audio: Gemma3 -> LTX2VideoTransformer3DModel (flow Euler) -> "
    "AutoencoderKLLTX2Video + AutoencoderKLLTX2Audio + vocoder",
    classes={"LTX2Pipeline", "LTX2ImageToVideoPipeline"},
    adapter=LTX2Adapter,
    output="video+audio",
    # LTX2Pipeline.__call__'s defaults (frame_rate is its fps)
    defaults={"num_inference_steps": 30, "guidance_scale": 3.0, "num_frames": DEFAULT_NUM_FRAMES, "fps": DEFAULT_FPS},
    extra_body_params=EXTRA_PARAMS,
)

# The published two-stage recipe as a deploy of this family (``omnistage serve MODEL --pipeline ltx2_two_stage``,
# placement in two_stage.yaml): LTX2Pipeline(output_type="latent") at half the size -> LTX2LatentUpsamplePipeline ->
# a 3-step LTX2Pipeline refine pass on the upsampled latents (handoff.py, refine.py).
TWO_STAGE = Pipeline(
    name="ltx2_two_stage",
    description="LTX-2 two-stage: first pass at half size (latents) -> 2x latent upsampler + 3-step refine pass "
    "-> AutoencoderKLLTX2Video + AutoencoderKLLTX2Audio + vocoder",
    stages=[
        StageSpec(
            0,
            kind="diffusion",
            name="first_pass",
            adapter=LTX2FirstPassAdapter,
            output="latent",
            default_params={**PIPELINE.stages[0].default_params, "output_type": "latent"},
            accumulation={"latent": AccumulationRule(one_payload)},  # a typed payload, not rows to concatenate
        ),
        StageSpec(
            1,
            kind="diffusion",
            name="refine",
            adapter=LTX2RefineAdapter,
            output="video+audio",
            can_output="video,audio,latent",
            final=True,
            knobs="none",  # the request's steps and guidance_scale are the first pass's; split_params carries the rest
            # the recipe's refine call: num_inference_steps=3 (its sigmas), guidance_scale=1.0
            default_params={"num_inference_steps": 3, "guidance_scale": 1.0},
            inputs=[Edge(0, process=to_refine_pass)],
        ),
    ],
    extra_body_params=EXTRA_PARAMS,
    folder_shape_request=split_params_for,
    deploy_file=Path(__file__).with_name("two_stage.yaml"),
)

PIPELINES = [PIPELINE, TWO_STAGE]
TINY = {"ltx2": build, "ltx2_i2v": build_i2v, "ltx23": build_v23}  # ltx23: the LTX-2.3 layout

__all__ = ["LTX2Adapter", "LTX2I2VAdapter", "PIPELINE", "PIPELINES", "TINY", "TWO_STAGE"]
