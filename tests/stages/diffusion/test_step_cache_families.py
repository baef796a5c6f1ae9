"""Step caching in every DiT family: each request batched with others (cached, uncached, at other steps, in
separate CFG passes, across Wan2.2's two experts, with GLM-Image's per-row source KV cache, through FLUX.2's
joined single-stream blocks) matches its solo cached result within 1e-5 and reuses the same steps (fp32, CPU, tiny
models); where a family names its tests/models/image_families.py row, the uncached request equals diffusers.

The rule here decides by step count alone (a threshold nothing reaches, ``max_consecutive_cached``), so
batch variance cannot flip a decision; test_step_cache.py checks the value-driven decisions against a
plain reference loop on SD3.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from PIL import Image

from .helpers import gen, latent, max_diff, reference_pipeline, run, start_engine


@dataclass
class Family:
    pipeline: Any
    adapter: Any
    folder: str
    params: dict  # every request's
    stage_id: int = 0
    inputs: Callable[[int], dict] = lambda i: {}  # the i-th request's extra stage inputs
    extra: dict = field(default_factory=dict)  # request id -> params of this family only
    reference: Any = None  # its tests/models/image_families.py row: the uncached request equals diffusers' __call__


def pattern(method: str) -> dict:
    return {"cache": {"method": method, "threshold": 1e9, "warmup_steps": 1, "max_consecutive_cached": 1}}


def wan(tiny_model, tmp_path_factory, name: str) -> Family:
    from omnistage.models.wan import PIPELINE, WanAdapter
    from omnistage.models.wan.tiny import build_wan22

    if name == "wan22":
        folder = tmp_path_factory.mktemp("tiny-wan22")
        build_wan22(folder)
        folder = str(folder)
    else:
        folder = str(tiny_model("wan"))
    params = dict(height=32, width=32, num_frames=5, max_sequence_length=16)
    if name == "wan22":
        params["guidance_scale_2"] = 2.0
    return Family(PIPELINE, WanAdapter.load(folder, torch.float32, torch.device("cpu")), folder, params)


def glm(tiny_model, i2i: bool) -> Family:
    from omnistage.models.glm_image import PIPELINE, GlmImageAdapter

    folder = str(tiny_model("glm_image"))

    def ids(seed: int, n: int) -> list[int]:
        return torch.randint(0, 64, (n,), generator=gen(seed)).tolist()

    def inputs(i: int) -> dict:
        out = {"prior_token_ids": ids(i, 4), "prior_grid": [2, 2]}
        if i2i:
            pixels = torch.randint(0, 256, (32, 64, 3), generator=gen(50 + i), dtype=torch.uint8).numpy()
            out.update(
                prior_token_image_ids=ids(60 + i, 2),
                source_image_grid_thw=[[1, 1, 2]],
                multi_modal_data={"image": [Image.fromarray(pixels)]},
            )
        return out

    return Family(
        PIPELINE,
        GlmImageAdapter.load(folder, torch.float32, torch.device("cpu")),
        folder,
        {},
        stage_id=1,
        inputs=inputs,
    )


def flux(tiny_model) -> Family:
    from omnistage.models.flux import PIPELINE, FluxAdapter

    folder = str(tiny_model("flux"))
    return Family(
        PIPELINE,
        FluxAdapter.load(folder, torch.float32, torch.device("cpu")),
        folder,
        dict(height=32, width=48, max_sequence_length=32),
    )


def z_image(tiny_model) -> Family:
    from omnistage.models.z_image import PIPELINE, ZImageAdapter

    folder = str(tiny_model("z_image"))
    return Family(
        PIPELINE, ZImageAdapter.load(folder, torch.float32, torch.device("cpu")), folder, dict(height=32, width=48)
    )


def qwen(tiny_model, edit_plus: bool) -> Family:
    import numpy as np

    from omnistage.models.qwen_image import PIPELINE, PIPELINES, QwenImageAdapter

    folder = str(tiny_model("qwen_image_edit_plus" if edit_plus else "qwen_image"))
    pipeline = next(p for p in PIPELINES if p.name.endswith("edit_plus")) if edit_plus else PIPELINE
    adapter = pipeline.stages[0].adapter.load(folder, torch.float32, torch.device("cpu"))
    assert isinstance(adapter, QwenImageAdapter)

    def inputs(i: int) -> dict:  # -2511 (zero_cond_t): input-image tokens at t = 0, a doubled temb
        pixels = np.random.default_rng(i).integers(0, 255, (40, 60, 3), dtype=np.uint8)
        return {"multi_modal_data": {"image": [Image.fromarray(pixels)]}} if edit_plus else {}

    # true CFG needs a negative prompt: r0 and r3 run it, r1 and "off" do not
    extra = {
        "r0": {"negative_prompt": "blurry", "true_cfg_scale": 3.0},
        "r3": {"negative_prompt": "dark", "true_cfg_scale": 2.0},
    }
    return Family(
        pipeline,
        adapter,
        folder,
        dict(height=64, width=64) if edit_plus else dict(height=32, width=48),
        inputs=inputs,
        extra=extra,
    )


def sana(tiny_model) -> Family:
    from omnistage.models.sana import PIPELINE, SanaAdapter

    folder = str(tiny_model("sana"))
    return Family(
        PIPELINE,
        SanaAdapter.load(folder, torch.float32, torch.device("cpu")),
        folder,
        dict(height=64, width=96, extra_args={"use_resolution_binning": False}),
    )


def flux_like(tiny_model, name: str) -> Family:
    """Ovis-Image / LongCat-Image: FLUX's block layout (double- then single-stream blocks), separate CFG passes."""
    from omnistage.models import longcat_image, ovis_image

    pipeline = {"ovis_image": ovis_image.PIPELINE, "longcat_image": longcat_image.PIPELINE}[name]
    folder = str(tiny_model(name))
    adapter = pipeline.stages[0].adapter.load(folder, torch.float32, torch.device("cpu"))
    return Family(pipeline, adapter, folder, dict(height=32, width=48))


def flux2(tiny_model, name: str) -> Family:
    """FLUX.2 [klein] (separate CFG passes) / [dev] (guidance embedding): double-stream blocks, then single-stream
    blocks on the joined text + image tokens, all taking the modulation computed once per forward."""
    from omnistage.models import flux2 as family
    from tests.models.image_families import FAMILIES

    pipeline = {"flux2": family.DEV, "flux2_klein": family.KLEIN}[name]
    folder = str(tiny_model(name))
    adapter = pipeline.stages[0].adapter.load(folder, torch.float32, torch.device("cpu"))
    row = next(f for f in FAMILIES if f.name == name)
    return Family(pipeline, adapter, folder, dict(row.size), reference=row)


def qwen21(tiny_model) -> Family:
    """Qwen-Image-2.1: one stream of joint tokens; the shared modulation's trailing t = 0 row stays when rows are cut.
    True CFG as a second forward: r0 and r3 run it."""
    from omnistage.models import qwen_image_21

    folder = str(tiny_model("qwen_image_21"))
    adapter = qwen_image_21.PIPELINE.stages[0].adapter.load(folder, torch.float32, torch.device("cpu"))
    extra = {
        "r0": {"negative_prompt": "blurry", "true_cfg_scale": 3.0},
        "r3": {"negative_prompt": "dark", "true_cfg_scale": 2.0},
    }
    return Family(qwen_image_21.PIPELINE, adapter, folder, dict(height=32, width=64), extra=extra)


CASES = {  # family -> (method: teacache where the tiny model has a single block, its builder)
    "wan": ("first_block", lambda tm, tp: wan(tm, tp, "wan")),
    "wan22": ("teacache", lambda tm, tp: wan(tm, tp, "wan22")),
    "glm_image": ("teacache", lambda tm, tp: glm(tm, i2i=False)),
    "glm_image_i2i": ("teacache", lambda tm, tp: glm(tm, i2i=True)),
    "flux": ("first_block", lambda tm, tp: flux(tm)),
    "z_image": ("teacache", lambda tm, tp: z_image(tm)),
    "qwen_image": ("first_block", lambda tm, tp: qwen(tm, edit_plus=False)),
    "qwen_image_edit_plus": ("teacache", lambda tm, tp: qwen(tm, edit_plus=True)),
    "sana": ("teacache", lambda tm, tp: sana(tm)),  # PixArt-Σ's block layout (masked text, per-row timestep)
    "ovis_image": ("teacache", lambda tm, tp: flux_like(tm, "ovis_image")),
    "longcat_image": ("first_block", lambda tm, tp: flux_like(tm, "longcat_image")),
    "flux2_klein": ("first_block", lambda tm, tp: flux2(tm, "flux2_klein")),
    "flux2": ("teacache", lambda tm, tp: flux2(tm, "flux2")),
    "qwen_image_21": ("first_block", lambda tm, tp: qwen21(tm)),
}

# (id, prompt, params): CFG and not, an uncached request, different step counts
SPECS = [
    ("r0", "a red cat", dict(num_inference_steps=7, seed=1, guidance_scale=4.0)),
    ("r1", "green square", dict(num_inference_steps=5, seed=2, guidance_scale=1.0)),
    ("off", "city skyline", dict(num_inference_steps=6, seed=3, guidance_scale=3.0, cache=False)),
    ("r3", "a blue chair", dict(num_inference_steps=6, seed=4, guidance_scale=2.0)),
]


@pytest.mark.parametrize("name", list(CASES))
async def test_batched_rows_match_solo(tiny_model, tmp_path_factory, name):
    method, make = CASES[name]
    fam = make(tiny_model, tmp_path_factory)
    engine = await start_engine(
        fam.pipeline, fam.adapter, fam.folder, stage_id=fam.stage_id, acceleration=pattern(method), max_num_seqs=16
    )

    def request(i: int, rid: str, prompt: str, kw: dict, started: asyncio.Event | None = None):
        return run(
            engine,
            rid,
            prompt,
            inputs=fam.inputs(i),
            started=started,
            output_type="latent",
            **fam.params,
            **kw,
            **fam.extra.get(rid.removesuffix("-solo"), {}),
        )

    try:
        solo = {}
        for i, (rid, prompt, kw) in enumerate(SPECS):
            outs = await request(i, rid + "-solo", prompt, kw)
            solo[rid] = (latent(outs), outs[-1].metrics.num_steps_reused)
        engine.accel.hooks.log.clear()
        tasks, prev = [], None
        for i, (rid, prompt, kw) in enumerate(SPECS):
            if prev is not None:
                await prev.wait()
            prev = asyncio.Event()
            tasks.append(asyncio.create_task(request(i, rid, prompt, kw, started=prev)))
        together = await asyncio.gather(*tasks)
        log = list(engine.accel.hooks.log)
    finally:
        await engine.shutdown()
    if fam.reference is not None:
        assert_off_equals_diffusers(fam, solo["off"][0])
    for (rid, _, _), outs in zip(SPECS, together):
        assert max_diff(latent(outs), solo[rid][0]) <= 1e-5, rid
        assert outs[-1].metrics.num_steps_reused == solo[rid][1], rid
        assert (solo[rid][1] > 0) == (rid != "off"), rid
    assert any(computing and reusing for computing, reusing in log)


def assert_off_equals_diffusers(fam: Family, got: torch.Tensor) -> None:
    """The ``cache: false`` request of a caching engine is diffusers' ``__call__`` (within the family row's
    ``solo_tol``: 0, or where diffusers' own order of operations differs)."""
    row = fam.reference
    rid, prompt, kw = next(s for s in SPECS if s[0] == "off")
    ref = reference_pipeline(row.diffusers_class, fam.folder)
    want = ref(
        prompt=prompt,
        num_inference_steps=kw["num_inference_steps"],
        guidance_scale=kw["guidance_scale"],
        generator=gen(kw["seed"]),
        output_type="latent",
        **fam.params,
    ).images
    if row.latent_view is not None:
        got = row.latent_view(ref, got, fam.params["height"], fam.params["width"])
    assert got.shape == want.shape and max_diff(got, want) <= row.solo_tol, rid
