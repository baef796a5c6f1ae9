"""GLM-Image's diffusion stage against diffusers' GlmImagePipeline given the same prior tokens (fp32, CPU)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omnistage.models.glm_image import PIPELINE, GlmImageAdapter, ar_tokens_to_prior
from omnistage.models.glm_image.grid import target_grids
from omnistage.stages.base import StageRequest
from omnistage.testing.streams import all_outputs, final_output
from tests.stages.diffusion.helpers import gen, max_diff, start_engine, tiny_family

folder, adapter, ref = tiny_family("glm_image", GlmImageAdapter, "GlmImagePipeline", dtype=torch.float32)


async def start(adapter, folder):
    """The diffusion stage (stage 1) of the GLM-Image pipeline on its own."""
    return await start_engine(PIPELINE, adapter, folder, stage_id=1)


def prior_ids(seed: int, th: int, tw: int) -> list[int]:
    return torch.randint(0, 64, (th * tw,), generator=gen(seed)).tolist()


async def run(engine, rid, prompt, ids, grid, **params):
    inputs = {"prompt": prompt, "prior_token_ids": ids, "prior_grid": list(grid)}
    return await all_outputs(engine.generate(StageRequest(rid, inputs, params)))


def reference(ref, prompt, ids, grid, seed, **kw):
    prior = ref._upsample_token_ids(torch.tensor(ids), *grid)
    th, tw = grid
    return ref(prompt, height=th * 32, width=tw * 32, prior_token_ids=prior, generator=gen(seed), **kw).images


@pytest.mark.parametrize("guidance", [1.5, 1.0])
async def test_solo_equals_diffusers_call(folder, adapter, ref, guidance):
    engine = await start(adapter, folder)
    try:
        grid = (2, 3)
        ids = prior_ids(0, *grid)
        kw = dict(num_inference_steps=4, guidance_scale=guidance)
        outs = await run(engine, "a", "a sign that says 'hi'", ids, grid, seed=7, output_type="latent", **kw)
        assert outs[-1].error is None, outs[-1].error
        expected = reference(ref, "a sign that says 'hi'", ids, grid, 7, output_type="latent", **kw)
        assert max_diff(outs[-1].data["latent"], expected) == 0.0

        outs = await run(engine, "b", "a red cat", ids, grid, seed=3, **kw)
        image = outs[-1].data["image"][0]
        expected = reference(ref, "a red cat", ids, grid, 3, output_type="pil", **kw)[0]
        assert image.shape == (64, 96, 3)
        assert np.array_equal(image, np.asarray(expected))
    finally:
        await engine.shutdown()


async def test_batched_requests_match_diffusers(folder, adapter, ref):
    """Three requests with the same resolution and glyph length share forwards (cond and uncond passes)."""
    engine = await start(adapter, folder)
    try:
        grid = (2, 2)
        specs = [("r0", "a red cat", 1, 1.5), ("r1", "a blue dog", 2, 3.0), ("r2", "green tree", 3, 1.0)]
        runs = [
            run(
                engine,
                rid,
                p,
                prior_ids(s, *grid),
                grid,
                seed=s,
                guidance_scale=g,
                num_inference_steps=4,
                output_type="latent",
            )
            for rid, p, s, g in specs
        ]
        results = await asyncio.gather(*runs)
        assert any(len(ids) == 3 for _, ids in engine.forward_log), list(engine.forward_log)
        for (_rid, p, s, g), outs in zip(specs, results):
            expected = reference(
                ref, p, prior_ids(s, *grid), grid, s, guidance_scale=g, num_inference_steps=4, output_type="latent"
            )
            assert max_diff(outs[-1].data["latent"], expected) <= 1e-5
    finally:
        await engine.shutdown()


async def test_bad_inputs_name_the_field(folder, adapter):
    engine = await start(adapter, folder)
    try:
        cases = [
            ({"prompt": "x"}, {}, "prior_token_ids"),
            ({"prompt": "x", "prior_token_ids": [1, 2, 3], "prior_grid": [2, 2]}, {}, "prior_token_ids"),
            ({"prompt": "x", "prior_token_ids": [1] * 4, "prior_grid": [2, "a"]}, {}, "prior_grid"),
            ({"prompt": "x", "prior_token_ids": [999] * 4, "prior_grid": [2, 2]}, {}, "prior_token_ids"),
            ({"prompt": "x", "prior_token_ids": [1] * 4, "prior_grid": [2, 2]}, {"height": 96}, "height"),
            (
                {"prompt": "x", "prior_token_ids": [1] * 4, "prior_grid": [2, 2], "negative_prompt": "y"},
                {},
                "negative_prompt",
            ),
        ]
        for inputs, params, field in cases:
            with pytest.raises(ValueError, match=field):
                await final_output(engine.generate(StageRequest("bad", inputs, params)))
    finally:
        await engine.shutdown()


def test_edge_cuts_the_target_grid_from_cumulative_ids():
    height, width = 64, 96
    (th, tw), (ph, pw) = target_grids(height, width)
    preview = list(range(ph * pw))
    target = [7] * (th * tw)
    request = SimpleNamespace(prompt={"prompt": "p", "image_size": (height, width)}, sampling_params=[{}, {}])
    out = ar_tokens_to_prior({"token_ids": preview + target + [65]}, request)
    assert out == {"prompt": "p", "prior_token_ids": target, "prior_grid": [th, tw]}
    assert "prior_token_image_ids" not in out  # present only for image-to-image
    with pytest.raises(ValueError, match="generated"):
        ar_tokens_to_prior({"token_ids": preview}, request)
    request.prompt["image_size"] = (50, 64)
    with pytest.raises(ValueError, match="image_size.height"):
        ar_tokens_to_prior({"token_ids": preview + target}, request)
