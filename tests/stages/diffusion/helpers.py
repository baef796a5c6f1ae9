"""Shared helpers for diffusion engine tests: build an engine on a loaded adapter, run requests, and load
diffusers' own pipelines as the reference."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from omnistage.config.schema import StageDeployConfig
from omnistage.pipeline import Pipeline, StageContext
from omnistage.stages.base import StageOutput, StageRequest
from omnistage.stages.diffusion.engine import DiffusionStageEngine


async def start_engine(
    pipeline: Pipeline, adapter: Any, model: str, stage_id: int = 0, **deploy: Any
) -> DiffusionStageEngine:
    ctx = StageContext(
        spec=pipeline.stages[stage_id], deploy=StageDeployConfig(stage_id=stage_id, **deploy), model=model
    )
    engine = DiffusionStageEngine(ctx, adapter=adapter)
    await engine.start()
    return engine


async def run(
    engine: DiffusionStageEngine,
    rid: str,
    prompt: str,
    *,
    inputs: dict | None = None,
    started: asyncio.Event | None = None,
    **params: Any,
) -> list[StageOutput]:
    """All outputs of one request; ``started`` is set once its first step is done."""
    outs = []
    async for o in engine.generate(StageRequest(rid, {"prompt": prompt, **(inputs or {})}, params)):
        outs.append(o)
        if started is not None and o.progress and o.progress[0] >= 1:
            started.set()
    if started is not None:
        started.set()
    return outs


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def noise_image(h: int, w: int, seed: int) -> Any:
    """A seeded RGB noise picture (PIL), an input image for edit tests."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def reference_pipeline(name: str, folder: Any, **kw: Any) -> Any:
    """diffusers' pipeline class ``name`` loaded from ``folder`` (progress bars off): the reference."""
    import diffusers

    pipe = getattr(diffusers, name).from_pretrained(folder, **kw)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def finished_data(outs: list[StageOutput]) -> dict[str, Any]:
    """The payload of a request that finished without an error."""
    assert outs[-1].finished and outs[-1].error is None, outs[-1].error
    return outs[-1].data


def latent(outs: list[StageOutput]) -> torch.Tensor:
    return finished_data(outs)["latent"]


async def solo_then_staggered(
    engine: DiffusionStageEngine, specs: list[tuple[str, str, dict]], **common: Any
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor], list[list[str]]]:
    """Run each (request id, prompt, params) alone, then all of them concurrently, each joining once the
    previous one has done a step. Returns (solo latents by id, concurrent latents in spec order, the
    request ids of every forward the concurrent run made)."""
    solo = {rid: latent(await run(engine, rid + "-solo", p, **kw, **common)) for rid, p, kw in specs}
    engine.forward_log.clear()
    tasks, prev = [], None
    for rid, p, kw in specs:
        if prev is not None:
            await prev.wait()
        prev = asyncio.Event()
        tasks.append(asyncio.create_task(run(engine, rid, p, started=prev, **kw, **common)))
    together = [latent(outs) for outs in await asyncio.gather(*tasks)]
    return solo, together, [ids for _, ids in engine.forward_log]


def tiny_family(
    tiny: str, adapter_class: Any = None, reference: str | None = None, *, folder: str = "folder", **ref_kw: Any
):
    """The module-scoped trio a family's engine tests start from: the tiny folder (fixture named ``folder``), the
    family's adapter loaded from it in fp32 on the CPU (``adapter``) and diffusers' pipeline class ``reference`` on
    the same folder (``ref``; ``ref_kw`` go to ``from_pretrained``). A test module assigns all three, so pytest
    finds them: ``folder, adapter, ref = tiny_family("wan", WanAdapter, "WanPipeline")``."""
    import pytest

    @pytest.fixture(scope="module", name=folder)
    def folder_fixture(tiny_model):
        return str(tiny_model(tiny))

    @pytest.fixture(scope="module", name="adapter")
    def adapter_fixture(request):
        assert adapter_class is not None, f"tiny_family({tiny!r}) names no adapter class"
        return adapter_class.load(request.getfixturevalue(folder), torch.float32, torch.device("cpu"))

    @pytest.fixture(scope="module", name="ref")
    def ref_fixture(request):
        assert reference is not None, f"tiny_family({tiny!r}) names no reference pipeline"
        return reference_pipeline(reference, request.getfixturevalue(folder), **ref_kw)

    return folder_fixture, adapter_fixture, ref_fixture
