"""Per-request step caching inside step batches, on a 3-block tiny SD3 (fp32, CPU).

Solo: the engine equals a plain per-request reference of the same rule exactly (cache_reference.py).
Batched with other requests (cached, uncached, at other steps): each within 1e-5 of its solo result.
Cache off, or a request that opts out: diffusers' own ``__call__`` exactly.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omnistage.models.sd3 import PIPELINE, SD3Adapter
from omnistage.models.sd3.tiny import build
from omnistage.stages.diffusion.step_cache import HOOK_NAME

from .cache_reference import Rule, generate
from .helpers import gen, latent, max_diff, reference_pipeline, run, start_engine

KW = dict(height=32, width=32, output_type="latent")


@pytest.fixture(scope="module")
def sd3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sd3-3blocks")
    build(folder, layers=3)  # first-block caching needs blocks after the first
    return str(folder)


@pytest.fixture(scope="module")
def adapter(sd3):
    return SD3Adapter.load(sd3, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module")
def ref(sd3):
    return reference_pipeline("StableDiffusion3Pipeline", sd3)


def cache(rule: Rule) -> dict:
    return {"cache": {k: v for k, v in vars(rule).items() if v is not None}}


RULES = {
    # thresholds inside the spread of this model's relative changes (0.2-0.45 first block, 0.04-0.1 teacache):
    # some steps compute, some reuse, decided by the values
    "first_block": Rule("first_block", threshold=0.35),
    "first_block_warmup": Rule("first_block", threshold=0.3, warmup_steps=3, max_consecutive_cached=2),
    "teacache": Rule("teacache", threshold=0.1),
    "teacache_coefficients": Rule("teacache", threshold=0.25, coefficients=[2.0, 0.01], max_consecutive_cached=3),
}


@pytest.mark.parametrize("guidance", [5.0, 1.0])
@pytest.mark.parametrize("name", list(RULES))
async def test_solo_equals_reference_loop(sd3, adapter, ref, name, guidance):
    rule, steps = RULES[name], 12
    engine = await start_engine(PIPELINE, adapter, sd3, acceleration=cache(rule))
    try:
        outs = await run(
            engine, "a", "a red cat on a chair", seed=7, num_inference_steps=steps, guidance_scale=guidance, **KW
        )
    finally:
        await engine.shutdown()
    expected, st = generate(
        ref, "a red cat on a chair", rule, seed=7, steps=steps, guidance=guidance, height=32, width=32
    )
    assert 0 < st.reused < steps - 1, st.rels  # both paths taken
    assert outs[-1].metrics.num_steps_reused == st.reused
    assert outs[-1].metrics.num_steps == steps
    assert max_diff(latent(outs), expected) == 0.0


async def _solo_and_together(engine, specs):
    solo = {}
    for rid, prompt, kw in specs:
        outs = await run(engine, rid + "-solo", prompt, **kw, **KW)
        solo[rid] = (latent(outs), outs[-1].metrics.num_steps_reused)
    engine.accel.hooks.log.clear()
    tasks, prev = [], None
    for rid, prompt, kw in specs:  # each joins once the previous one has done a step
        if prev is not None:
            await prev.wait()
        prev = asyncio.Event()
        tasks.append(asyncio.create_task(run(engine, rid, prompt, started=prev, **kw, **KW)))
    together = {
        rid: (latent(o), o[-1].metrics.num_steps_reused) for (rid, _, _), o in zip(specs, await asyncio.gather(*tasks))
    }
    return solo, together, list(engine.accel.hooks.log)


SPECS = [
    ("r0", "a red cat", dict(num_inference_steps=12, seed=1, guidance_scale=5.0)),
    ("r1", "green square", dict(num_inference_steps=9, seed=2, guidance_scale=1.0)),
    ("off", "blue chair at night", dict(num_inference_steps=8, seed=3, guidance_scale=3.5, cache=False)),
    (
        "r3",
        "city skyline",
        dict(num_inference_steps=10, seed=4, guidance_scale=4.0, num_outputs_per_prompt=2, negative_prompt="blurry"),
    ),
]


@pytest.mark.parametrize(
    "rule",
    [
        # decisions by step count alone (a threshold nothing reaches): batch variance cannot flip one
        Rule("first_block", threshold=1e9, warmup_steps=1, max_consecutive_cached=1),
        Rule("teacache", threshold=1e9, max_consecutive_cached=2),
        # decisions by the values
        Rule("first_block", threshold=0.35),
    ],
    ids=["first_block_pattern", "teacache_pattern", "first_block_threshold"],
)
async def test_batched_rows_match_their_solo_results(sd3, adapter, rule):
    engine = await start_engine(PIPELINE, adapter, sd3, acceleration=cache(rule), max_num_seqs=16)
    try:
        solo, together, log = await _solo_and_together(engine, SPECS)
    finally:
        await engine.shutdown()
    for rid, (lat, reused) in together.items():
        assert max_diff(lat, solo[rid][0]) <= 1e-5, rid
        assert reused == solo[rid][1], rid
    assert together["off"][1] == 0
    assert all(together[r][1] > 0 for r in ("r0", "r1", "r3"))
    # some forwards ran the blocks for some rows while other rows reused theirs
    assert any(computing and reusing for computing, reusing in log)
    assert any(len(computing) + len(reusing) >= 3 for computing, reusing in log)


async def test_cache_off_and_opt_out_are_diffusers_exactly(sd3, adapter, ref):
    kw = dict(num_inference_steps=6, guidance_scale=5.0, height=32, width=32)
    expected = ref("a red cat", generator=gen(3), output_type="latent", **kw).images
    for acc, params in ((None, {}), ({}, {}), (cache(RULES["first_block"]), {"cache": False})):
        engine = await start_engine(PIPELINE, adapter, sd3, acceleration=acc)
        try:
            outs = await run(engine, "a", "a red cat", seed=3, output_type="latent", **kw, **params)
        finally:
            await engine.shutdown()
        assert max_diff(latent(outs), expected) == 0.0
        assert outs[-1].metrics.num_steps_reused == 0
    # the hooks left the (shared) model with the engine
    from diffusers.hooks import HookRegistry

    assert all(
        HookRegistry.check_if_exists_or_initialize(b).get_hook(HOOK_NAME) is None
        for b in adapter.pipe.transformer.transformer_blocks
    )


async def test_decoded_images_with_cache(sd3, adapter):
    """The step cache changes latents only; the VAE decode and output path stay the engine's own."""
    engine = await start_engine(PIPELINE, adapter, sd3, acceleration=cache(RULES["first_block"]))
    try:
        outs = await run(
            engine, "a", "a red cat", seed=3, num_inference_steps=8, guidance_scale=5.0, height=32, width=32
        )
    finally:
        await engine.shutdown()
    image = outs[-1].data["image"][0]
    assert image.dtype == np.uint8 and image.shape == (32, 32, 3)
    assert outs[-1].metrics.num_steps_reused > 0


async def test_refusals_name_the_field(tiny_model, tmp_path):
    from omnistage.models.sd import PIPELINE as SD_PIPELINE
    from omnistage.models.sd import SDAdapter

    folder = str(tiny_model("sd15"))
    unet = SDAdapter.load(folder, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"stages\[0\]\.acceleration\.cache: SDAdapter exposes no transformer block"):
        await start_engine(SD_PIPELINE, unet, folder, acceleration=cache(Rule("first_block", 0.1)))
    one_block = str(tiny_model("sd3"))  # the default tiny SD3 has a single block
    adapter = SD3Adapter.load(one_block, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="first_block caching needs at least 2"):
        await start_engine(PIPELINE, adapter, one_block, acceleration=cache(Rule("first_block", 0.1)))


async def test_through_the_public_api(sd3, ref):
    """Deploy config ``acceleration:`` -> the stage caches; ``extra_body: {"cache": false}`` opts a request out
    (then diffusers' own output exactly); the stage metrics count the reused steps."""
    from omnistage import AsyncOmni, RequestKnobs

    deploy = {"stages": [{"stage_id": 0, "acceleration": cache(RULES["first_block"])}]}
    params = {"num_inference_steps": 12, "guidance_scale": 5.0, "height": 32, "width": 32}
    async with AsyncOmni(model=sd3, deploy_config=deploy) as omni:
        finals = {}
        for name, knobs in (
            ("cached", RequestKnobs(seed=7)),
            ("opt_out", RequestKnobs(seed=7).knobs({"cache": False})),
        ):
            async for out in omni.generate("a red cat on a chair", sampling_params_list=[params], knobs=knobs):
                pass
            assert out.finished and out.error is None, out.error
            finals[name] = out
    assert finals["cached"].metrics[0]["num_steps_reused"] > 0
    assert finals["opt_out"].metrics[0]["num_steps_reused"] == 0
    expected = ref("a red cat on a chair", generator=gen(7), **params).images[0]
    assert np.array_equal(np.asarray(finals["opt_out"].images[0]), np.asarray(expected))
    assert not np.array_equal(np.asarray(finals["cached"].images[0]), np.asarray(expected))
