"""The diffusion engine on the tiny LTX-2 models (video + audio from one DiT), checked against diffusers'
``LTX2Pipeline`` / ``LTX2ImageToVideoPipeline`` ``__call__`` (fp32, CPU): frames and waveform equal for a lone
request, three concurrent requests within 1e-5 of their solo latents, bad input a ValueError naming the field."""

from __future__ import annotations

import asyncio
import inspect

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.models.ltx2 import PIPELINE, LTX2Adapter
from omnistage.models.ltx2 import request as ltx2_request
from omnistage.stages.base import StageRequest
from tests.stages.diffusion.helpers import (
    finished_data,
    gen,
    max_diff,
    reference_pipeline,
    run,
    solo_then_staggered,
    start_engine,
    tiny_family,
)

SMALL = dict(height=32, width=32, num_frames=9, fps=25, max_sequence_length=16)  # video [1, 1280, 4], audio [1, 9, 8]
REF_SMALL = dict(height=32, width=32, num_frames=9, frame_rate=25.0, max_sequence_length=16)
# the tiny DiT has 2 blocks: STG perturbs block 1 (the release's default block 28 does not exist here)
STG = {"spatio_temporal_guidance_blocks": [1]}


folder, adapter, ref = tiny_family("ltx2", LTX2Adapter, "LTX2Pipeline")


def ref_outputs(out) -> tuple[np.ndarray, np.ndarray]:
    """diffusers' np video [1, T, H, W, 3] in [0, 1] -> uint8 frames (diffusers' PIL rounding); its waveform."""
    return (out.frames[0] * 255).round().astype(np.uint8), out.audio[0].float().numpy()


def test_defaults_are_the_pipelines():
    from diffusers import LTX2Pipeline

    sig = inspect.signature(LTX2Pipeline.__call__).parameters
    defaults = PIPELINE.stages[0].default_params
    assert defaults["num_inference_steps"] == sig["num_inference_steps"].default
    assert defaults["guidance_scale"] == sig["guidance_scale"].default
    assert defaults["fps"] == sig["frame_rate"].default
    assert ltx2_request.DEFAULT_HEIGHT == sig["height"].default and ltx2_request.DEFAULT_WIDTH == sig["width"].default
    assert ltx2_request.MAX_SEQUENCE_LENGTH == sig["max_sequence_length"].default
    assert list(ltx2_request.STG_BLOCKS) == sig["spatio_temporal_guidance_blocks"].default
    for key, value in ltx2_request.GUIDANCE.items():
        assert sig[key].default == value, key


def test_family_resolves_from_the_folder(folder, tiny_model):
    from omnistage.pipeline import resolve_pipeline

    assert resolve_pipeline(folder).name == "ltx2"
    assert resolve_pipeline(str(tiny_model("ltx2_i2v"))).name == "ltx2"
    assert str(PIPELINE.stages[0].output_modality) == "audio+video"


@pytest.mark.parametrize(
    "guidance",
    [
        dict(guidance_scale=3.0, extra_args=STG),  # the pipeline's defaults: CFG, STG, modality isolation, rescale
        dict(guidance_scale=1.0, extra_args={"audio_guidance_scale": 1.0, **STG}),  # no CFG, STG + isolation still on
        dict(
            guidance_scale=4.0,
            extra_args={
                "stg_scale": 0.0,
                "audio_stg_scale": 0.0,
                "modality_scale": 1.0,
                "audio_modality_scale": 1.0,
                "guidance_rescale": 0.0,
            },
        ),  # CFG alone
    ],
)
async def test_solo_equals_diffusers_call(folder, adapter, ref, guidance):
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        outs = await run(
            engine, "a", "a red cat", seed=11, negative_prompt="blurry", num_inference_steps=3, **SMALL, **guidance
        )
        data = finished_data(outs)
        want_video, want_audio = ref_outputs(
            ref(
                "a red cat",
                negative_prompt="blurry",
                generator=gen(11),
                num_inference_steps=3,
                guidance_scale=guidance["guidance_scale"],
                output_type="np",
                **REF_SMALL,
                **guidance["extra_args"],
            )
        )
        assert data["video"].dtype == np.uint8 and data["video"].shape == (9, 32, 32, 3)
        assert np.array_equal(data["video"], want_video)
        assert data["audio"].shape == want_audio.shape == (2, 5280)  # stereo, 9 latent audio frames x 4 x 160 - 3 x 160
        assert np.abs(data["audio"] - want_audio).max() == 0.0
        assert data["fps"] == 25 and data["sample_rate"] == 16000
        assert [o.progress for o in outs[:-1]] == [(0, 0), (1, 3), (2, 3)]  # taken, then per step
    finally:
        await engine.shutdown()


async def test_concurrent_requests_share_forwards_and_match_solo(folder, adapter):
    """Different prompts, seeds, step counts and guidance (one without CFG and with other STG blocks, one with no
    extra guidance pass), each joining a running batch."""
    specs = [
        ("r0", "a red cat", dict(num_inference_steps=6, seed=1, guidance_scale=3.0, extra_args=STG)),
        (
            "r1",
            "green square",
            dict(
                num_inference_steps=4,
                seed=2,
                guidance_scale=1.0,
                extra_args={"audio_guidance_scale": 1.0, "modality_scale": 1.0, "audio_modality_scale": 1.0},
            ),
        ),  # STG on the default block 28
        (
            "r2",
            "city skyline",
            dict(
                num_inference_steps=5,
                seed=3,
                guidance_scale=4.0,
                negative_prompt="blurry",
                extra_args={
                    "stg_scale": 0.0,
                    "audio_stg_scale": 0.0,
                    "modality_scale": 1.0,
                    "audio_modality_scale": 1.0,
                },
            ),
        ),
    ]
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        solo, together, batches = await solo_then_staggered(engine, specs, output_type="latent", **SMALL)
        for (rid, _, _), got in zip(specs, together):
            assert max_diff(got, solo[rid]) <= 1e-5, rid
        assert batches[0] == ["r0"]
        assert max(len(b) for b in batches) == 3  # all three shared a forward
        assert len(batches) < sum(kw["num_inference_steps"] for _, _, kw in specs)
    finally:
        await engine.shutdown()


async def test_video_alone_skips_the_audio_decode(folder, adapter, ref):
    """``wanted="video"`` (what the orchestrator sends for ``modalities: ["video"]``): no audio decode, the
    same video (the audio latents are still denoised: the video attends to them)."""
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(SMALL, num_inference_steps=2, seed=5, guidance_scale=3.0, extra_args=STG)
        outs = [o async for o in engine.generate(StageRequest("v", {"prompt": "a red cat"}, kw, wanted="video"))]
        data = finished_data(outs)
        assert "audio" not in data and "sample_rate" not in data
        want_video, _ = ref_outputs(
            ref(
                "a red cat",
                generator=gen(5),
                num_inference_steps=2,
                guidance_scale=3.0,
                output_type="np",
                **REF_SMALL,
                **STG,
            )
        )
        assert np.array_equal(data["video"], want_video)
    finally:
        await engine.shutdown()


async def test_batched_decode_gives_each_request_its_video_and_audio(folder, adapter, ref):
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(num_inference_steps=2, guidance_scale=3.0, **SMALL)
        a, b = await asyncio.gather(
            run(engine, "a", "a red cat", seed=1, **kw), run(engine, "b", "green square", seed=2, **kw)
        )
        assert any(len(ids) == 2 for _, ids in engine.forward_log)
        for outs, prompt, seed in ((a, "a red cat", 1), (b, "green square", 2)):
            video, audio = ref_outputs(
                ref(
                    prompt,
                    generator=gen(seed),
                    num_inference_steps=2,
                    guidance_scale=3.0,
                    output_type="np",
                    **REF_SMALL,
                )
            )
            data = finished_data(outs)
            # batched with another request: float batch variance may move a pixel by one uint8 level at most
            assert np.abs(data["video"].astype(int) - video.astype(int)).max() <= 1
            assert np.abs(data["audio"] - audio).max() <= 1e-4
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "params,inputs,field",
    [
        (dict(height=48), {}, "height"),
        (dict(width=40), {}, "width"),
        (dict(num_outputs_per_prompt=2), {}, "num_outputs_per_prompt"),
        (dict(guidance_scale_2=3.0), {}, "guidance_scale_2"),
        (dict(extra_args={"motion_speed": 0.0}), {}, "motion_speed"),
        (dict(extra_args={"spatio_temporal_guidance_blocks": []}), {}, "spatio_temporal_guidance_blocks"),
        ({}, {"multi_modal_data": {"image": Image.new("RGB", (32, 32))}}, "multi_modal_data.image"),
    ],
)
async def test_bad_params_name_the_field(folder, adapter, params, inputs, field):
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        with pytest.raises(ValueError, match=field):
            await run(engine, "bad", "a red cat", inputs=inputs, **{**SMALL, **params})
        assert not engine.forward_log  # refused before any work
    finally:
        await engine.shutdown()


# ----------------------------------------------------------------- image-to-video


@pytest.fixture(scope="module")
def i2v(tiny_model):
    folder = str(tiny_model("ltx2_i2v"))
    return folder, LTX2Adapter.load(folder, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("crf", [None, 0])  # the model's default re-compression of the first frame (33), and none
async def test_i2v_solo_equals_diffusers_call(i2v, crf):
    folder, adapter = i2v
    assert type(adapter).__name__ == "LTX2I2VAdapter"
    ref = reference_pipeline("LTX2ImageToVideoPipeline", folder)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8))
    extra = {} if crf is None else {"image_crf": crf}
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        kw = dict(SMALL, width=64, num_inference_steps=3, guidance_scale=3.0)
        outs = await run(
            engine,
            "a",
            "a red cat",
            inputs={"multi_modal_data": {"image": image}},
            seed=3,
            extra_args={**STG, **extra},
            **kw,
        )
        data = finished_data(outs)
        video, audio = ref_outputs(
            ref(
                image=image,
                prompt="a red cat",
                generator=gen(3),
                num_inference_steps=3,
                guidance_scale=3.0,
                output_type="np",
                **dict(REF_SMALL, width=64),
                **STG,
                **extra,
            )
        )
        assert data["video"].shape == (9, 32, 64, 3)
        assert np.array_equal(data["video"], video)
        assert np.abs(data["audio"] - audio).max() == 0.0
        with pytest.raises(ValueError, match="multi_modal_data.image"):
            await run(engine, "no-image", "a red cat", **kw)
    finally:
        await engine.shutdown()


def test_the_fixture_exercises_every_guidance_term(folder, ref):
    """STG and modality isolation each change the result on the tiny model (else the tests above would not
    check them): the fixture's DiT has perturbable attention and audio<->video cross-attention."""
    kw = dict(
        REF_SMALL,
        num_inference_steps=2,
        guidance_scale=1.0,
        audio_guidance_scale=1.0,
        output_type="latent",
        guidance_rescale=0.0,
        audio_guidance_rescale=0.0,
    )
    off = dict(stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0)
    base = ref("a red cat", generator=gen(1), **kw, **off).frames
    for on in (dict(off, stg_scale=1.0, **STG), dict(off, modality_scale=3.0)):
        assert max_diff(ref("a red cat", generator=gen(1), **kw, **on).frames, base) > 1e-4, on


# ----------------------------------------------------------------- the LTX-2.3 layout


@pytest.fixture(scope="module")
def v23(tiny_model):
    folder = str(tiny_model("ltx23"))
    return (
        folder,
        LTX2Adapter.load(folder, torch.float32, torch.device("cpu")),
        reference_pipeline("LTX2Pipeline", folder),
    )


def test_ltx23_folder_is_served_by_the_family(v23):
    """An LTX-2.3 folder is the same ``LTX2Pipeline`` class with other component configs: per-modality text
    projections in the connectors (none in the DiT), gated attention, prompt modulation, a vocoder with bandwidth
    extension. The family claims it and the adapter runs it through the same components."""
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

    from omnistage.pipeline import resolve_pipeline

    folder, adapter, _ = v23
    assert resolve_pipeline(folder).name == "ltx2"
    assert adapter.pipe.connectors.config.per_modality_projections
    assert adapter.pipe.transformer.config.cross_attn_mod and not adapter.pipe.transformer.config.use_prompt_embeddings
    assert isinstance(adapter.pipe.vocoder, LTX2VocoderWithBWE) and adapter.sr == 32000


@pytest.mark.parametrize(
    "guidance",
    [
        dict(guidance_scale=3.0, extra_args=STG),  # the pipeline's defaults (LTX-2.3's suggested values)
        dict(guidance_scale=4.0, extra_args={"stg_scale": 0.0, "audio_stg_scale": 0.0, "modality_scale": 1.0}),
    ],
)
async def test_ltx23_solo_equals_diffusers_call(v23, guidance):
    folder, adapter, ref = v23
    engine = await start_engine(PIPELINE, adapter, folder)
    try:
        outs = await run(
            engine, "a", "a red cat", seed=7, negative_prompt="blurry", num_inference_steps=2, **SMALL, **guidance
        )
        data = finished_data(outs)
        want_video, want_audio = ref_outputs(
            ref(
                "a red cat",
                negative_prompt="blurry",
                generator=gen(7),
                num_inference_steps=2,
                guidance_scale=guidance["guidance_scale"],
                output_type="np",
                **REF_SMALL,
                **guidance["extra_args"],
            )
        )
        assert np.array_equal(data["video"], want_video)
        assert data["audio"].shape == want_audio.shape == (2, 10560)  # the BWE doubles the LTX-2 vocoder's 5280
        assert np.abs(data["audio"] - want_audio).max() == 0.0
        assert data["sample_rate"] == 32000
    finally:
        await engine.shutdown()


def test_ltx23_offline_defaults_equal_diffusers_defaults(v23):
    """``Omni`` with no guidance knob set: the family's defaults fill guidance, STG, modality isolation and
    rescale, as diffusers' ``__call__`` defaults do (the STG default block 28 does not exist in the 2-block
    DiT: both skip nothing)."""
    from omnistage import Omni
    from omnistage.params import DiffusionSamplingParams

    folder, _, ref = v23
    params = DiffusionSamplingParams(
        seed=5, num_inference_steps=2, height=32, width=32, num_frames=9, max_sequence_length=16
    )
    omni = Omni(folder)
    try:
        [out] = omni.generate({"prompt": "a red cat"}, [params], use_tqdm=False)
    finally:
        omni.close()
    assert out.error is None, out.error
    want_video, want_audio = ref_outputs(
        ref(
            "a red cat",
            generator=gen(5),
            num_inference_steps=2,
            height=32,
            width=32,
            num_frames=9,
            max_sequence_length=16,
            output_type="np",
        )
    )
    assert np.array_equal(np.asarray(out.video), want_video)
    assert np.abs(out.audio - want_audio).max() == 0.0
