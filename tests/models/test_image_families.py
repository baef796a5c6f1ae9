"""The shared harness every image family joins with a row in tests/models/image_families.py: through
``AsyncOmni`` (fp32, CPU), a solo request equals diffusers' own ``__call__`` for the same seed (latents,
then the uint8 images), and 3-4 concurrent requests that join the running batch at different steps each
stay within 1e-5 of their solo results while sharing forwards. One engine and one reference pipeline per
family for the whole module."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final, solo_then_staggered

from .image_families import FAMILIES, by_name

ONE_LOOP = pytest.mark.asyncio(loop_scope="module")  # the engines fixture's loop

SOLO = [pytest.param(f.name, r.id, id=f"{f.name}-{r.id}") for f in FAMILIES for r in f.solo]
NAMES = [f.name for f in FAMILIES]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.fixture(scope="module")
def refs(tiny_model) -> Any:
    """diffusers' pipeline of a family, loaded once per module."""
    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in cache:
            import diffusers

            pipe = getattr(diffusers, by_name(name).diffusers_class).from_pretrained(tiny_model(name))
            pipe.set_progress_bar_config(disable=True)
            cache[name] = pipe
        return cache[name]

    return get


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(tiny_model):
    """A started ``AsyncOmni`` per family (returning latents as well as images), shared by the module."""
    cache: dict[str, AsyncOmni] = {}

    async def get(name: str) -> AsyncOmni:
        if name not in cache:
            fam = by_name(name)
            deploy = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent", **fam.deploy}]}
            cache[name] = await AsyncOmni(str(tiny_model(name)), deploy_config=deploy).start()
        return cache[name]

    yield get
    for omni in cache.values():
        await omni.shutdown()


@pytest.mark.parametrize("name", NAMES)
def test_folder_resolves_to_its_pipeline(name, tiny_model):
    assert resolve_pipeline(tiny_model(name)).name == name


@ONE_LOOP
@pytest.mark.parametrize("name,case", SOLO)
async def test_solo_equals_diffusers_call(name, case, engines, refs):
    fam = by_name(name)
    req = next(r for r in fam.solo if r.id == case)
    omni, ref = await engines(name), refs(name)
    out = await generate_final(omni, req.engine_prompt(), req.engine_params(fam, output_type="latent"))
    expected = ref(prompt=req.prompt, **req.diffusers_kwargs(fam, output_type="latent")).images
    got = (
        out.latents
        if fam.latent_view is None
        else fam.latent_view(ref, out.latents, fam.size["height"], fam.size["width"])
    )
    assert got.shape == expected.shape and expected.shape[0] == req.n
    assert max_diff(got, expected) <= fam.solo_tol
    out = await generate_final(omni, req.engine_prompt(), req.engine_params(fam))
    expected = ref(prompt=req.prompt, **req.diffusers_kwargs(fam)).images
    assert len(out.images) == len(expected) == req.n
    for got, want in zip(out.images, expected):
        got, want = np.asarray(got), np.asarray(want)
        assert got.shape == want.shape == (fam.size["height"], fam.size["width"], 3)
        if fam.solo_tol == 0.0:
            assert np.array_equal(got, want)
        else:
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


@ONE_LOOP
@pytest.mark.parametrize("name", NAMES)
async def test_concurrent_requests_match_their_solo_results(name, engines):
    fam = by_name(name)
    assert 3 <= len(fam.concurrent) <= 4
    omni = await engines(name)
    specs = [(r.engine_prompt(), r.engine_params(fam, output_type="latent")) for r in fam.concurrent]
    solo, together, forwards = await solo_then_staggered(omni, specs)
    for i, (s, t) in enumerate(zip(solo, together)):
        assert s.latents.shape == t.latents.shape
        # 1e-5, relative where the latents exceed 1: the random tiny noise predictors (PixArt-Σ's) blow latents
        # up to hundreds, where fp32's own spacing is 3e-5
        assert max_diff(t.latents, s.latents) <= 1e-5 * max(1.0, s.latents.abs().max().item()), i
    assert len(forwards[0]) == 1  # the first request ran alone...
    assert max(len(ids) for ids in forwards) >= 2  # ...then they shared forwards (how many overlap depends on load)
    # the requests really differ (a harness that returned one result for all would pass the rest)
    assert not torch.equal(together[0].latents[:1], together[1].latents[:1])
