"""GLM-Image's diffusion stage, image-to-image: against diffusers' GlmImagePipeline given the same
prior tokens, source-image tokens and source images (fp32, CPU)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.stages.base import StageRequest
from omnistage.testing.streams import all_outputs
from tests.stages.diffusion.helpers import gen, max_diff

from .test_dit_stage import adapter, folder, prior_ids, ref, start  # noqa: F401  (module-scoped fixtures)

STEPS = 4
GUIDANCE = 1.5  # diffusers' default; the engine called directly has no stage default_params, so pass it to both


def source_image(seed: int, h: int, w: int) -> Image.Image:
    """A random RGB image of a d32 grid's size (h*32 x w*32 px), as the AR stage hands it on."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h * 32, w * 32, 3), dtype=np.uint8))


def i2i_inputs(prompt: str, target: tuple[int, int], sources: list[tuple[int, int, int]]) -> dict:
    """Stage-1 inputs as the edge passes them; ``sources`` = [(seed, h, w)] per source image (d32 grids)."""
    th, tw = target
    return {
        "prompt": prompt,
        "prior_token_ids": prior_ids(100 + th * tw, th, tw),
        "prior_grid": [th, tw],
        "prior_token_image_ids": sum((prior_ids(s, h, w) for s, h, w in sources), []),
        "source_image_grid_thw": [[1, h, w] for _, h, w in sources],
        "multi_modal_data": {"image": [source_image(s, h, w) for s, h, w in sources]},
    }


async def run(engine, rid, inputs, **params):
    params.setdefault("guidance_scale", GUIDANCE)
    return await all_outputs(engine.generate(StageRequest(rid, inputs, params)))


def reference(ref, inputs, seed, **kw):
    """diffusers' own call with the same tokens: ids upsampled x2 per grid, as generate_prior_tokens does."""
    th, tw = inputs["prior_grid"]
    grids = inputs["source_image_grid_thw"]
    ids = torch.split(torch.tensor(inputs["prior_token_image_ids"]), [h * w for _, h, w in grids])
    source_ids = torch.cat([ref._upsample_token_ids(part, h, w).squeeze(0) for part, (_, h, w) in zip(ids, grids)])
    kw.setdefault("num_inference_steps", STEPS)
    kw.setdefault("guidance_scale", GUIDANCE)
    return ref(
        inputs["prompt"],
        image=inputs["multi_modal_data"]["image"],
        height=th * 32,
        width=tw * 32,
        prior_token_ids=ref._upsample_token_ids(torch.tensor(inputs["prior_token_ids"]), th, tw),
        prior_token_image_ids=[source_ids],
        source_image_grid_thw=[torch.tensor([[1, 2 * h, 2 * w] for _, h, w in grids])],
        generator=gen(seed),
        **kw,
    ).images


def t2i_reference(ref, inputs, seed, **kw):
    th, tw = inputs["prior_grid"]
    prior = ref._upsample_token_ids(torch.tensor(inputs["prior_token_ids"]), th, tw)
    kw.setdefault("guidance_scale", GUIDANCE)
    return ref(
        inputs["prompt"],
        height=th * 32,
        width=tw * 32,
        prior_token_ids=prior,
        generator=gen(seed),
        num_inference_steps=STEPS,
        **kw,
    ).images


@pytest.mark.parametrize("guidance", [1.5, 1.0])
async def test_solo_i2i_equals_diffusers_call(folder, adapter, ref, guidance):
    engine = await start(adapter, folder)
    try:
        inputs = i2i_inputs("a red cat", (2, 3), [(1, 2, 2)])
        kw = dict(num_inference_steps=STEPS, guidance_scale=guidance)
        outs = await run(engine, "a", inputs, seed=7, output_type="latent", **kw)
        assert outs[-1].error is None, outs[-1].error
        expected = reference(ref, inputs, 7, output_type="latent", guidance_scale=guidance)
        assert max_diff(outs[-1].data["latent"], expected) == 0.0
        # the source image really conditions the result: without it the latents differ
        t2i = {k: inputs[k] for k in ("prompt", "prior_token_ids", "prior_grid")}
        assert max_diff(expected, t2i_reference(ref, t2i, 7, output_type="latent", guidance_scale=guidance)) > 1e-3

        outs = await run(engine, "b", inputs, seed=3, **kw)
        image = outs[-1].data["image"][0]
        expected = reference(ref, inputs, 3, output_type="pil", guidance_scale=guidance)[0]
        assert image.shape == (64, 96, 3)
        assert np.array_equal(image, np.asarray(expected))
    finally:
        await engine.shutdown()


async def test_two_source_images_in_one_request(folder, adapter, ref):
    engine = await start(adapter, folder)
    try:
        inputs = i2i_inputs("a sign that says 'hi'", (2, 2), [(1, 2, 2), (2, 2, 3)])
        outs = await run(engine, "two", inputs, seed=5, output_type="latent", num_inference_steps=STEPS)
        assert outs[-1].error is None, outs[-1].error
        expected = reference(ref, inputs, 5, output_type="latent")
        assert max_diff(outs[-1].data["latent"], expected) == 0.0
    finally:
        await engine.shutdown()


async def test_outputs_per_prompt_share_the_source_cache(folder, adapter, ref):
    """Two rows of one request each carry the cache; diffusers expands its single cached sample instead."""
    engine = await start(adapter, folder)
    try:
        inputs = i2i_inputs("a red cat", (2, 3), [(1, 2, 2)])
        outs = await run(
            engine, "n2", inputs, seed=7, output_type="latent", num_inference_steps=STEPS, num_outputs_per_prompt=2
        )
        expected = reference(ref, inputs, 7, output_type="latent", num_images_per_prompt=2)
        assert outs[-1].data["latent"].shape[0] == 2
        assert max_diff(outs[-1].data["latent"], expected) == 0.0
    finally:
        await engine.shutdown()


async def test_concurrent_i2i_batch_and_never_mix_with_t2i(folder, adapter, ref):
    engine = await start(adapter, folder)
    try:
        # same target grid, glyph length and source length (2x2 and 1x4 grids: 16 cached tokens each)
        specs = [
            ("i0", i2i_inputs("a red cat", (2, 2), [(1, 2, 2)]), 1, 1.5),
            ("i1", i2i_inputs("a blue dog", (2, 2), [(2, 1, 4)]), 2, 3.0),
            ("i2", i2i_inputs("green tree", (2, 2), [(3, 2, 2)]), 3, 1.0),
        ]
        results = await asyncio.gather(
            *[
                run(engine, rid, inp, seed=s, guidance_scale=g, num_inference_steps=STEPS, output_type="latent")
                for rid, inp, s, g in specs
            ]
        )
        assert any(len(ids) == 3 for _, ids in engine.forward_log), list(engine.forward_log)
        for (_rid, inp, s, g), outs in zip(specs, results):
            assert outs[-1].error is None, outs[-1].error
            expected = reference(ref, inp, s, guidance_scale=g, output_type="latent")
            assert max_diff(outs[-1].data["latent"], expected) <= 1e-5

        engine.forward_log.clear()
        i2i = i2i_inputs("a red cat", (2, 2), [(4, 2, 2)])
        t2i = {k: i2i[k] for k in ("prompt", "prior_token_ids", "prior_grid")}  # same target and glyph length
        out_i, out_t = await asyncio.gather(
            run(engine, "i", i2i, seed=8, num_inference_steps=STEPS, output_type="latent"),
            run(engine, "t", t2i, seed=9, num_inference_steps=STEPS, output_type="latent"),
        )
        assert all(len(ids) == 1 for _, ids in engine.forward_log), list(engine.forward_log)
        assert max_diff(out_i[-1].data["latent"], reference(ref, i2i, 8, output_type="latent")) == 0.0
        assert max_diff(out_t[-1].data["latent"], t2i_reference(ref, t2i, 9, output_type="latent")) == 0.0
    finally:
        await engine.shutdown()


async def test_bad_i2i_inputs_name_the_field(folder, adapter):
    engine = await start(adapter, folder)
    try:
        good = i2i_inputs("x", (2, 2), [(1, 2, 2)])

        def bad(**changes):
            return {**good, **changes}

        def without(key):
            return {k: v for k, v in good.items() if k != key}

        cases = [
            (bad(prior_token_image_ids=[1] * 3), "prior_token_image_ids"),  # 3 ids for a 2x2 grid
            (bad(prior_token_image_ids=[999] * 4), "prior_token_image_ids"),  # outside the codebook
            (bad(prior_token_image_ids=[-1] * 4), "prior_token_image_ids"),
            (bad(prior_token_image_ids=[0.5] * 4), "prior_token_image_ids"),
            (bad(prior_token_image_ids="abcd"), "prior_token_image_ids"),
            (bad(source_image_grid_thw=[[1, 2, 2], [1, 1, 1]]), "source_image_grid_thw"),  # 2 grids, 1 image
            (bad(source_image_grid_thw=[[2, 2]]), "source_image_grid_thw"),
            (bad(source_image_grid_thw=[[1, 0, 4]]), "source_image_grid_thw"),
            (without("multi_modal_data"), "multi_modal_data.image"),  # grid but no image
            (without("prior_token_image_ids"), "prior_token_image_ids"),
            (without("source_image_grid_thw"), "source_image_grid_thw"),
            (bad(multi_modal_data={"image": source_image(1, 2, 3)}), r"multi_modal_data.image\[0\]"),  # wrong size
            (bad(multi_modal_data={"image": Image.new("RGB", (60, 64))}), r"multi_modal_data.image\[0\]"),
        ]
        for inputs, field in cases:
            with pytest.raises(ValueError, match=field):
                await run(engine, "bad", inputs, num_inference_steps=STEPS)
        with pytest.raises(ValueError, match="strength"):
            await run(engine, "bad", good, num_inference_steps=STEPS, strength=0.5)
        # the engine keeps serving
        outs = await run(engine, "ok", good, seed=1, num_inference_steps=2, output_type="latent")
        assert outs[-1].error is None and outs[-1].data["latent"].shape == (1, 4, 8, 8)
    finally:
        await engine.shutdown()
