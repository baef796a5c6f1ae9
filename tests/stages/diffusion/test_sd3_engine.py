"""The diffusion engine on the tiny SD3 model, checked against diffusers' own pipelines (fp32, CPU)."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from PIL import Image

from omnistage.models.sd3 import PIPELINE, SD3Adapter
from omnistage.testing.streams import final_output

from .helpers import gen, latent, max_diff, reference_pipeline, run, solo_then_staggered, start_engine, tiny_family

sd3, adapter, ref = tiny_family("sd3", SD3Adapter, "StableDiffusion3Pipeline", folder="sd3")


@pytest.mark.parametrize("guidance", [7.0, 1.0])
async def test_solo_equals_diffusers_call(sd3, adapter, ref, guidance):
    engine = await start_engine(PIPELINE, adapter, sd3)
    try:
        kw = dict(num_inference_steps=5, guidance_scale=guidance, height=32, width=48)
        outs = await run(engine, "a", "a red cat on a chair", seed=11, output_type="latent", **kw)
        expected = ref("a red cat on a chair", generator=gen(11), output_type="latent", **kw).images
        assert max_diff(latent(outs), expected) == 0.0
        assert [o.progress for o in outs[:-1]] == [(0, 0)] + [(i, 5) for i in range(1, 5)]  # taken, then per step
        assert outs[-1].metrics.num_steps == 5

        outs = await run(engine, "b", "a red cat on a chair", seed=11, negative_prompt="blurry", **kw)
        expected = ref("a red cat on a chair", generator=gen(11), negative_prompt="blurry", **kw).images[0]
        image = outs[-1].data["image"][0]
        assert image.dtype == np.uint8 and image.shape == (32, 48, 3)
        assert np.array_equal(image, np.asarray(expected))
    finally:
        await engine.shutdown()


async def test_num_outputs_per_prompt(sd3, adapter, ref):
    engine = await start_engine(PIPELINE, adapter, sd3)
    try:
        kw = dict(num_inference_steps=3, guidance_scale=4.0, height=32, width=32)
        outs = await run(engine, "n", "green square", seed=5, num_outputs_per_prompt=3, **kw)
        images = outs[-1].data["image"]
        expected = ref("green square", generator=gen(5), num_images_per_prompt=3, **kw).images
        assert len(images) == 3
        for got, want in zip(images, expected):
            assert np.array_equal(got, np.asarray(want))
        assert not np.array_equal(images[0], images[1])
    finally:
        await engine.shutdown()


async def test_concurrent_requests_match_their_solo_results(sd3, adapter):
    """Different prompts, seeds, step counts and guidance (incl. <= 1), each joining a running batch."""
    specs = [
        ("r0", "a red cat", dict(num_inference_steps=12, seed=1, guidance_scale=7.0)),
        ("r1", "green square", dict(num_inference_steps=8, seed=2, guidance_scale=1.0)),
        (
            "r2",
            "blue chair at night",
            dict(num_inference_steps=6, seed=3, guidance_scale=3.5, num_outputs_per_prompt=2),
        ),
        ("r3", "city skyline", dict(num_inference_steps=7, seed=4, guidance_scale=5.0, negative_prompt="blurry")),
    ]
    common = dict(height=32, width=32, output_type="latent")
    engine = await start_engine(PIPELINE, adapter, sd3)
    try:
        solo, together, batches = await solo_then_staggered(engine, specs, **common)
        for (rid, _, _), got in zip(specs, together):
            assert max_diff(got, solo[rid]) <= 1e-5, rid
        assert max(len(b) for b in batches) == 4  # all four shared forwards...
        assert batches[0] == ["r0"]  # ...after joining at different steps
        assert len(batches) < sum(kw["num_inference_steps"] for _, _, kw in specs)
    finally:
        await engine.shutdown()


async def test_abort_midway_frees_the_slot(sd3, adapter, ref):
    engine = await start_engine(PIPELINE, adapter, sd3, max_num_seqs=1)
    try:
        started = asyncio.Event()
        long = asyncio.create_task(
            run(
                engine,
                "long",
                "a red cat",
                started=started,
                num_inference_steps=200,
                height=32,
                width=32,
                output_type="latent",
                seed=1,
            )
        )
        await started.wait()
        queued = asyncio.create_task(
            run(
                engine, "next", "green square", num_inference_steps=3, height=32, width=32, output_type="latent", seed=2
            )
        )
        await engine.abort("long")
        outs = await long
        assert outs[-1].finished and outs[-1].finish_reason == "abort"
        assert outs[-1].progress[0] < 200
        # the queued request then ran alone, untouched by the aborted one: diffusers' own result
        expected = ref(
            "green square", generator=gen(2), num_inference_steps=3, height=32, width=32, output_type="latent"
        ).images
        assert max_diff(latent(await queued), expected) == 0.0
        ran_long = sum(1 for _, ids in engine.forward_log if ids == ["long"])
        assert ran_long < 200
        stats = engine.stats()
        assert stats.running == 0 and stats.queue_depth == 0
    finally:
        await engine.shutdown()


async def test_batch_keys_never_share_a_forward(sd3, adapter):
    engine = await start_engine(PIPELINE, adapter, sd3)
    try:
        kw = dict(num_inference_steps=4, output_type="latent")
        solo_a = latent(await run(engine, "a0", "a red cat", seed=1, height=32, width=32, **kw))
        solo_b = latent(await run(engine, "b0", "a red cat", seed=1, height=48, width=32, **kw))
        engine.forward_log.clear()
        a, b = await asyncio.gather(
            run(engine, "a", "a red cat", seed=1, height=32, width=32, **kw),
            run(engine, "b", "a red cat", seed=1, height=48, width=32, **kw),
        )
        assert max_diff(latent(a), solo_a) <= 1e-5 and max_diff(latent(b), solo_b) <= 1e-5
        for _, ids in engine.forward_log:
            assert ids in (["a"], ["b"])
    finally:
        await engine.shutdown()


async def test_other_key_is_served_within_bounded_wait(sd3, adapter, ref):
    """A request of another key waiting behind a long-running key gets in after max_wait_steps forwards."""
    wait = 3
    engine = await start_engine(PIPELINE, adapter, sd3, engine_args={"max_wait_steps": wait})
    try:
        started = asyncio.Event()
        long = asyncio.create_task(
            run(
                engine,
                "long",
                "a red cat",
                started=started,
                num_inference_steps=60,
                height=32,
                width=32,
                output_type="latent",
                seed=1,
            )
        )
        await started.wait()
        submitted_at = len(engine.forward_log)
        other = await run(
            engine, "other", "green square", num_inference_steps=2, height=48, width=32, output_type="latent", seed=2
        )
        assert other[-1].error is None
        assert not long.done()  # served while the long request still runs, not after it drained
        log = list(engine.forward_log)
        first = next(i for i, (_, ids) in enumerate(log) if "other" in ids)
        assert first - submitted_at <= wait + 1
        # paused for the other key and resumed with nothing lost: still diffusers' own result
        expected = ref(
            "a red cat", generator=gen(1), num_inference_steps=60, height=32, width=32, output_type="latent"
        ).images
        assert max_diff(latent(await long), expected) == 0.0
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "params,inputs,field",
    [
        (dict(height=30), {}, "height"),
        (dict(width=50), {}, "width"),
        (dict(num_inference_steps=0), {}, "num_inference_steps"),
        (dict(guidance_scale=-1.0), {}, "guidance_scale"),
        (dict(strength=0.5), {}, "strength"),
        (dict(strength=1.5), {"multi_modal_data": {"image": Image.new("RGB", (32, 32))}}, "strength"),
        (dict(num_outputs_per_prompt=0), {}, "num_outputs_per_prompt"),
        ({}, {"multi_modal_data": {"image": np.zeros((32, 32, 3), np.uint8)}}, "multi_modal_data.image"),
        (dict(output_type="gif"), {}, "output_type"),
        (dict(max_sequence_length=1024), {}, "max_sequence_length"),
        (dict(bogus=1), {}, "bogus"),
    ],
)
async def test_bad_params_name_the_field_and_disturb_nothing(sd3, adapter, params, inputs, field):
    engine = await start_engine(PIPELINE, adapter, sd3)
    try:
        kw = dict(num_inference_steps=4, height=32, width=32, output_type="latent", seed=3)
        solo = latent(await run(engine, "solo", "a red cat", **kw))
        started = asyncio.Event()
        good = asyncio.create_task(run(engine, "good", "a red cat", started=started, **kw))
        await started.wait()
        with pytest.raises(ValueError, match=field):
            await run(engine, "bad", "a red cat", inputs=inputs, **{"height": 32, "width": 32, **params})
        assert max_diff(latent(await good), solo) <= 1e-5
    finally:
        await engine.shutdown()


async def test_img2img_equals_diffusers_img2img(sd3, adapter):
    ref = reference_pipeline("StableDiffusion3Img2ImgPipeline", sd3)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8))
    engine = await start_engine(PIPELINE, adapter, sd3)
    try:
        kw = dict(num_inference_steps=10, strength=0.6, guidance_scale=5.0, height=32, width=48)
        outs = await run(
            engine, "i", "a red cat", inputs={"multi_modal_data": {"image": image}}, seed=8, output_type="latent", **kw
        )
        expected = ref("a red cat", image=image, generator=gen(8), output_type="latent", **kw).images
        assert max_diff(latent(outs), expected) == 0.0
        assert outs[-1].metrics.num_steps == 6  # strength 0.6 of 10 steps
    finally:
        await engine.shutdown()


async def test_undeclared_extra_args_are_dropped_at_the_edge(sd3, caplog):
    """Model-specific keys are filtered once, where the request enters (AsyncOmni), with one warning."""
    from omnistage import AsyncOmni, InvalidRequestError, RequestKnobs

    kw = dict(num_inference_steps=3, height=32, width=32, seed=4)
    async with AsyncOmni(sd3) as omni:
        plain = (await final_output(omni.generate("a red cat", sampling_params_list=[kw]))).images[0]
        with caplog.at_level(logging.WARNING):
            out = await final_output(
                omni.generate("a red cat", sampling_params_list=[kw], knobs=RequestKnobs(not_a_knob=1))
            )
        assert caplog.text.count("not_a_knob") == 1
        assert np.array_equal(np.asarray(out.images[0]), np.asarray(plain))
        with pytest.raises(InvalidRequestError, match="mu: expected float") as err:
            omni.make_request("a red cat", sampling_params_list=[{**kw, "extra_args": {"mu": "high"}}])
        assert err.value.field == "mu"


@pytest.mark.parametrize("window_steps, together", [(1000.0, True), (0.0, False)])
async def test_a_burst_after_a_batch_finished_starts_as_one_batch(sd3, adapter, window_steps, together):
    """Clients answered together come back a few ms apart. With the admission window (``admit_window_steps``
    step times, at most ``MAX_ADMIT_WINDOW_S``, after several requests finished together) the first waits for
    the second and they share every forward; without it the first runs a step ahead. A request that finished
    alone opens no window: the next one starts at once."""
    engine = await start_engine(PIPELINE, adapter, sd3, engine_args={"admit_window_steps": window_steps})
    kw = dict(num_inference_steps=3, guidance_scale=4.0, height=32, width=32)

    async def pair(a: str, b: str) -> list[list[str]]:
        first = asyncio.create_task(run(engine, a, "a red cat", seed=1, **kw))
        await asyncio.sleep(0.01)  # the second arrives a moment later
        await asyncio.gather(first, run(engine, b, "green square", seed=2, **kw))
        return [ids for _, ids in engine.forward_log if a in ids or b in ids]

    try:
        await asyncio.gather(run(engine, "w1", "x", seed=0, **kw), run(engine, "w2", "y", seed=0, **kw))
        if together:
            assert await pair("a", "b") == [["a", "b"]] * 3
        else:
            assert (await pair("a", "b"))[0] == ["a"]  # a alone, a+b twice, b alone
        await run(engine, "c", "z", seed=0, **kw)  # finishes alone
        assert (await pair("d", "e"))[0] == ["d"]
    finally:
        await engine.shutdown()
