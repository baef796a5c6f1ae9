"""A diffusion replica over two ranks (gloo on CPU, fp32): CFG-parallel and Ulysses sequence-parallel
outputs equal the single-device engine's for the DiT families (sd3, flux, wan, qwen_image, z_image), alone
and with four concurrent requests; CFG-parallel alone on a UNet (SDXL) and FLUX.2 [klein]; aborts work; a
rank dying fails the replica's requests clearly and the replica restarts."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
import torch

from omnistage import AsyncOmni, StageUnavailableError
from omnistage.testing.staggered import generate_final, solo_then_staggered
from omnistage.transport.worker import STATS_INTERVAL_S

pytestmark = pytest.mark.slow

TOL = 1e-5

# Four requests per family: CFG and no CFG, several rows, different steps and seeds, submitted one step apart
# (enough steps that all four overlap however fast the steps run: the single-device run must batch them all).
SPECS: dict[str, tuple[dict[str, Any], list[tuple[Any, dict[str, Any]]]]] = {
    "sd3": (
        dict(height=32, width=32, max_sequence_length=16),
        [
            ("a red cat", dict(num_inference_steps=12, seed=1, guidance_scale=4.0)),
            ("green square", dict(num_inference_steps=10, seed=2, guidance_scale=1.0, num_outputs_per_prompt=3)),
            (
                {"prompt": "a bowl of fruit", "negative_prompt": "blurry"},
                dict(num_inference_steps=9, seed=3, guidance_scale=6.5, num_outputs_per_prompt=2),
            ),
            ("city skyline at night", dict(num_inference_steps=7, seed=4, guidance_scale=1.0)),
        ],
    ),
    "flux": (
        dict(height=32, width=48, max_sequence_length=32),
        [
            ("a red cat", dict(num_inference_steps=12, seed=1, guidance_scale=3.5)),
            (
                {"prompt": "green square", "negative_prompt": "blurry"},
                dict(num_inference_steps=10, seed=2, guidance_scale=2.0, true_cfg_scale=4.0),
            ),
            ("mountains at sunset", dict(num_inference_steps=9, seed=3, guidance_scale=6.0, num_outputs_per_prompt=2)),
            (
                {"prompt": "city skyline", "negative_prompt": "dark"},
                dict(num_inference_steps=7, seed=4, guidance_scale=1.0, true_cfg_scale=2.5),
            ),
        ],
    ),
    "wan": (
        dict(height=32, width=32, num_frames=5, max_sequence_length=16),
        [
            ("a red cat", dict(num_inference_steps=10, seed=1, guidance_scale=5.0)),
            ("green square", dict(num_inference_steps=8, seed=2, guidance_scale=1.0)),
            (
                {"prompt": "a bowl of fruit", "negative_prompt": "blurry"},
                dict(num_inference_steps=8, seed=3, guidance_scale=3.0),
            ),
            (
                "city skyline",
                dict(num_inference_steps=6, seed=4, guidance_scale=1.0),
            ),  # a video request makes one video
        ],
    ),
    # prompts of different token lengths: the batch's text is padded and masked
    "qwen_image": (
        dict(height=32, width=48),
        [
            ("a red cat", dict(num_inference_steps=12, seed=1)),
            (
                {"prompt": "green square and yellow circle", "negative_prompt": "blurry"},
                dict(num_inference_steps=10, seed=2, true_cfg_scale=4.0),
            ),
            (
                "a watercolor painting of mountains at sunset",
                dict(num_inference_steps=9, seed=3, num_outputs_per_prompt=2),
            ),
            (
                {"prompt": "city skyline", "negative_prompt": "dark, low quality, jpeg artifacts"},
                dict(num_inference_steps=7, seed=4, true_cfg_scale=2.5),
            ),
        ],
    ),
    "z_image": (
        dict(height=32, width=48),
        [
            ("a red cat", dict(num_inference_steps=12, seed=1, guidance_scale=0.0)),
            (
                {"prompt": "a watercolor painting of mountains at sunset, high detail", "negative_prompt": "blurry"},
                dict(num_inference_steps=10, seed=2, guidance_scale=4.0),
            ),
            ("green square", dict(num_inference_steps=9, seed=3, guidance_scale=2.0, num_outputs_per_prompt=2)),
            (
                "city skyline at night with neon lights",
                dict(
                    num_inference_steps=7,
                    seed=4,
                    guidance_scale=3.0,
                    extra_args=dict(cfg_normalization=1.2, cfg_truncation=0.6),
                ),
            ),
        ],
    ),
}


def deploy(parallel: dict[str, int] | None = None, output: str = "image") -> dict[str, Any]:
    stage: dict[str, Any] = {"stage_id": 0, "engine_output_type": f"{output},latent"}
    if parallel:
        stage["parallel_config"] = parallel
    return {"stages": [stage]}


def latents(out: Any) -> torch.Tensor:
    return out.latents if out.latents is not None else out.video


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


async def solo_and_together(
    folder: str, family: str, parallel: dict[str, int] | None, solo: int | None = None
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[str]]]:
    common, specs = SPECS[family]
    async with AsyncOmni(folder, deploy_config=deploy(parallel, "video" if family == "wan" else "image")) as omni:
        solo, together, forwards = await solo_then_staggered(
            omni, [(p, {**common, **kw, "output_type": "latent"}) for p, kw in specs], solo=solo
        )
    return [latents(o) for o in solo], [latents(o) for o in together], forwards


@pytest.mark.parametrize("family", ["sd3", "flux", "wan", "qwen_image", "z_image"])
async def test_two_ranks_equal_one_device(family, tiny_model):
    folder = str(tiny_model(family))
    ref_solo, ref_together, forwards = await solo_and_together(folder, family, None)
    assert max(len(ids) for ids in forwards) == 4  # the single-device run did batch all four together
    for parallel in ({"cfg_parallel_size": 2}, {"ulysses_degree": 2}):
        # over two ranks only the first request also runs alone (a batch of one; the suite's time is bounded)
        solo, together, _ = await solo_and_together(folder, family, parallel, solo=1)
        assert len(solo) == 1 and solo[0].shape == ref_solo[0].shape and max_diff(solo[0], ref_solo[0]) <= TOL
        for i, (ref, b) in enumerate(zip(ref_solo, together)):
            assert b.shape == ref.shape and max_diff(b, ref) <= TOL, (parallel, "together vs solo", i)
        for i, (ref, b) in enumerate(zip(ref_together, together)):
            assert max_diff(b, ref) <= TOL, (parallel, "vs single-device together", i)


# CFG parallel alone, for models without a sequence-parallel plan (Ulysses is refused for them at start-up): a
# UNet (SDXL, with its per-row time ids) and FLUX.2 [klein] (CFG as separate passes of its own rows)
CFG_ONLY: dict[str, tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]] = {
    "sdxl": (
        dict(height=32, width=32),
        [
            ("a red cat", dict(num_inference_steps=4, seed=1, guidance_scale=6.0)),
            ("green square", dict(num_inference_steps=3, seed=2, guidance_scale=1.0, num_outputs_per_prompt=3)),
        ],
    ),
    "flux2_klein": (
        dict(height=32, width=48, max_sequence_length=32),
        [
            ("a red cat", dict(num_inference_steps=2, seed=1, guidance_scale=4.0)),
            ("green square", dict(num_inference_steps=2, seed=2, guidance_scale=1.0, num_outputs_per_prompt=3)),
        ],
    ),
}


@pytest.mark.parametrize("family", list(CFG_ONLY))
async def test_cfg_parallel_needs_no_sequence_plan(family, tiny_model):
    """CFG parallelism splits rows, not tokens: families without a Ulysses plan run it exactly too."""
    folder = str(tiny_model(family))
    common, specs = CFG_ONLY[family]
    results = []
    for parallel in (None, {"cfg_parallel_size": 2}):
        async with AsyncOmni(folder, deploy_config=deploy(parallel)) as omni:
            results.append(
                [latents(await generate_final(omni, p, {**common, **kw, "output_type": "latent"})) for p, kw in specs]
            )
    for i, (ref, got) in enumerate(zip(*results)):
        # 1e-5 on unit-scale values: the random tiny SDXL UNet leaves Euler latents at |x| ~ 12
        assert got.shape == ref.shape and max_diff(got, ref) <= TOL * max(1.0, ref.abs().max().item()), i


async def wait_healthy(omni: AsyncOmni, timeout_s: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    engine = omni.replicas(0)[0]
    while not engine.stats().healthy or engine.restarts == 0:
        assert loop.time() < deadline, engine.stats()
        await asyncio.sleep(0.2)


async def test_abort_and_a_dying_rank(tiny_model):
    folder = str(tiny_model("sd3"))
    common = dict(height=32, width=32, max_sequence_length=16, output_type="latent")
    check = ("a red cat", {**common, "num_inference_steps": 3, "seed": 7, "guidance_scale": 4.0})
    long = {**common, "num_inference_steps": 400, "seed": 1, "guidance_scale": 4.0}
    async with AsyncOmni(folder, deploy_config=deploy()) as omni:
        expected = latents(await generate_final(omni, *check))

    async with AsyncOmni(folder, deploy_config=deploy({"cfg_parallel_size": 2})) as omni:
        engine = omni.replicas(0)[0]

        async def started(rid: str) -> asyncio.Task:
            """A long request, once it has done a step."""
            first = asyncio.Event()

            async def consume() -> list[Any]:
                outs = []
                async for o in omni.generate("a blue chair", request_id=rid, sampling_params_list=[long]):
                    outs.append(o)
                    if o.progress and o.progress[0] >= 1:
                        first.set()
                return outs

            task = asyncio.create_task(consume())
            await asyncio.wait_for(first.wait(), 60)
            return task

        # abort: the caller's stream ends early, the replica lets the request go, the ranks stay in step
        # (the next result is still exact)
        task = await started("long-1")
        await omni.abort("long-1")
        outs = await asyncio.wait_for(task, 30)
        assert max(o.progress[0] for o in outs if o.progress) < long["num_inference_steps"]
        assert omni.running_requests() == []
        assert max_diff(latents(await generate_final(omni, *check)), expected) <= TOL
        # the parent's stats are the snapshot the replica sends every STATS_INTERVAL_S: the next ones say idle
        deadline = asyncio.get_running_loop().time() + 10 * STATS_INTERVAL_S
        while engine.stats().running and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(STATS_INTERVAL_S / 2)
        assert engine.stats().running == 0

        # rank 1 killed mid-request: the request fails as unavailable, naming the rank; the group restarts
        pids = engine.rank_pids
        task = await started("long-2")
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(StageUnavailableError, match="rank 1 of 2"):
            await asyncio.wait_for(task, 60)
        await wait_healthy(omni)
        assert engine.restarts == 1 and set(engine.rank_pids).isdisjoint(pids)
        assert max_diff(latents(await generate_final(omni, *check)), expected) <= TOL
