"""torch.compile, CPU offload and VAE tiling of a diffusion stage (``acceleration:``), on a 3-block tiny SD3.

Each is compared with the plain path (tiling: with diffusers' own tiled decode) on the same requests.
On this CPU-only machine offloading moves nothing, so it must be exact; its memory effect is measured
on a GPU (benchmarks/diffusion_acceleration.py).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omnistage.models.sd3 import PIPELINE, SD3Adapter
from omnistage.models.sd3.tiny import build
from omnistage.stages.diffusion.step_cache import HOOK_NAME

from .helpers import gen, latent, max_diff, reference_pipeline, run, start_engine

KW = dict(height=32, width=32, output_type="latent")
PATTERN = {"cache": {"method": "first_block", "threshold": 1e9, "warmup_steps": 1, "max_consecutive_cached": 1}}
SPECS = [
    ("r0", "a red cat", dict(num_inference_steps=8, seed=1, guidance_scale=5.0)),
    ("r1", "green square", dict(num_inference_steps=6, seed=2, guidance_scale=1.0)),
    (
        "r2",
        "blue chair at night",
        dict(num_inference_steps=7, seed=3, guidance_scale=3.5, cache=False, num_outputs_per_prompt=2),
    ),
]


@pytest.fixture(scope="module")
def sd3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sd3-3blocks")
    build(folder, layers=3)
    return str(folder)


def fresh(sd3: str) -> SD3Adapter:
    """Offload and compile change the loaded model: each configuration gets its own."""
    return SD3Adapter.load(sd3, torch.float32, torch.device("cpu"))


async def staggered(engine, specs, **kw):
    """Each request joins once the previous one has done a step; latents by request id."""
    tasks, prev = [], None
    for rid, prompt, params in specs:
        if prev is not None:
            await prev.wait()
        prev = asyncio.Event()
        tasks.append(asyncio.create_task(run(engine, rid, prompt, started=prev, **params, **kw)))
    return {rid: latent(o) for (rid, _, _), o in zip(specs, await asyncio.gather(*tasks))}


async def plain_results(sd3, acceleration, specs):
    engine = await start_engine(PIPELINE, fresh(sd3), sd3, acceleration=acceleration)
    try:
        return {rid: latent(await run(engine, rid, p, **kw, **KW)) for rid, p, kw in specs}
    finally:
        await engine.shutdown()


class CountGraphs:
    """A torch.compile backend that counts the graphs dynamo hands it and runs them as traced."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs += 1
        return gm.forward


@pytest.mark.parametrize(
    "acceleration", [{"compile": True}, {"compile": True, **PATTERN}], ids=["compile", "compile+cache"]
)
async def test_compile_reuses_its_graphs_as_batches_change(sd3, acceleration):
    """Dynamic shapes: after one request at 2 rows and one at 1 row (dynamo specialises size 1), joins,
    leaves, cached rows dropping out of the blocks and another resolution compile nothing new."""
    eager = {k: v for k, v in acceleration.items() if k != "compile"} or None
    expected = await plain_results(sd3, eager, SPECS)
    counter = CountGraphs()
    with torch.compiler.set_stance("default", force_backend=counter):  # counts what the stage compiles
        engine = await start_engine(PIPELINE, fresh(sd3), sd3, acceleration=acceleration, max_num_seqs=16)
        try:
            for rid, p, kw in SPECS[:2]:  # 2 rows (CFG), then 1 row
                await run(engine, rid + "-warm", p, **kw, **KW)
            warm = counter.graphs
            assert warm > 0
            together = await staggered(engine, SPECS, **KW)
            other_size = await run(
                engine,
                "wide",
                "a red cat",
                seed=1,
                num_inference_steps=4,
                guidance_scale=5.0,
                height=32,
                width=48,
                output_type="latent",
            )
        finally:
            await engine.shutdown()
    assert counter.graphs == warm, f"recompiled: {warm} graphs after warm-up, {counter.graphs} at the end"
    assert latent(other_size).shape[-1] == 24
    for rid, lat in together.items():
        assert max_diff(lat, expected[rid]) <= 1e-5, rid


@pytest.mark.slow  # inductor's CPU code generation takes minutes on a busy 2-core machine
async def test_compile_with_inductor_matches_the_plain_path(sd3):
    specs = SPECS[:2]
    expected = await plain_results(sd3, None, specs)
    compiled = await plain_results(sd3, {"compile": True}, specs)
    for rid in expected:
        assert max_diff(compiled[rid], expected[rid]) <= 1e-5, rid


@pytest.mark.parametrize(
    "acceleration",
    [{"offload": "model"}, {"offload": "layer"}, {"offload": "layer", **PATTERN}],
    ids=["model", "layer", "layer+cache"],
)
async def test_offload_runs_and_changes_nothing(sd3, acceleration):
    cached = {k: v for k, v in acceleration.items() if k != "offload"} or None
    adapter = fresh(sd3)
    engine = await start_engine(PIPELINE, adapter, sd3, acceleration=acceleration, max_num_seqs=16)
    try:
        tr = adapter.pipe.transformer
        if acceleration["offload"] == "model":  # accelerate's hooks on every component
            assert type(tr._hf_hook).__name__ == "CpuOffload"
            assert type(adapter.pipe.vae._hf_hook).__name__ == "CpuOffload"
        else:  # diffusers' group offloading on every block (and the step cache's, when caching)
            from diffusers.hooks import HookRegistry

            registry = HookRegistry.check_if_exists_or_initialize(tr.transformer_blocks[0])
            assert registry.get_hook("group_offloading") is not None
            assert (registry.get_hook(HOOK_NAME) is not None) == ("cache" in acceleration)
        solo = {rid: latent(await run(engine, rid, p, **kw, **KW)) for rid, p, kw in SPECS}
        together = await staggered(engine, SPECS, **KW)
        image = await run(
            engine, "img", "a red cat", seed=5, num_inference_steps=4, guidance_scale=5.0, height=32, width=32
        )
    finally:
        await engine.shutdown()
    expected = await plain_results(sd3, cached, SPECS)
    for rid in expected:
        assert max_diff(solo[rid], expected[rid]) == 0.0, rid
        assert max_diff(together[rid], expected[rid]) <= 1e-5, rid
    if cached is None:  # the decoded image too (the VAE and text encoders were offloaded as well)
        ref = reference_pipeline("StableDiffusion3Pipeline", sd3)
        want = ref("a red cat", generator=gen(5), num_inference_steps=4, guidance_scale=5.0, height=32, width=32)
        assert np.array_equal(image[-1].data["image"][0], np.asarray(want.images[0]))


async def test_vae_tiling_equals_diffusers_tiled_decode(sd3):
    """64x64 px = 32x32 latents, above this VAE's 16-latent tile: the decode really tiles."""
    kw = dict(num_inference_steps=3, guidance_scale=5.0, height=64, width=64)
    engine = await start_engine(PIPELINE, fresh(sd3), sd3, acceleration={"vae_tiling": True})
    try:
        outs = await run(engine, "t", "a red cat", seed=9, **kw)
    finally:
        await engine.shutdown()
    got = outs[-1].data["image"][0]
    ref = reference_pipeline("StableDiffusion3Pipeline", sd3)
    untiled = np.asarray(ref("a red cat", generator=gen(9), **kw).images[0])
    ref.vae.enable_tiling()
    tiled = np.asarray(ref("a red cat", generator=gen(9), **kw).images[0])
    assert not np.array_equal(tiled, untiled)  # tiling changes the decode: the comparison below means something
    assert np.array_equal(got, tiled)
