"""Per-request LoRA on the image families that take it, one table row each: through ``AsyncOmni`` (fp32, CPU),
requests with the adapter, the adapter at another scale and none share one forward, and each equals
diffusers' own pipeline after ``load_lora_weights`` of the same adapter file (``set_adapters`` and the
pipeline's ``{"scale": s}`` keyword; ``disable_lora`` for none) within 1e-5.

A row names its family's row in image_families.py (size, reference class, extra knobs, latent view), the tiny
adapter fixture and the requests. FLUX.1 and SD3 keep their own modules (kohya alphas, per-layer ranks, two
adapters, true CFG's separate negative pass: tests/models/flux, tests/models/sd3)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from omnistage import AsyncOmni
from omnistage.testing.staggered import generate_final

from .image_families import ImageFamily, Req, by_name


@dataclass(frozen=True)
class LoraRow:
    family: str  # the row of image_families.py, and the base model's tiny fixture
    adapter: str  # the tiny LoRA fixture (random non-zero A and B on the denoiser's attention projections)
    scale_kw: str  # diffusers' ``__call__`` keyword that carries {"scale": s}
    cases: tuple[tuple[Req, str | None, float], ...]  # (request, adapter or None, lora_scale): one forward

    def __str__(self) -> str:
        return self.family


ROWS = [
    LoraRow(
        "sana",
        "sana_lora",
        "attention_kwargs",
        (  # CFG and not, the adapter at two scales and none
            (Req("a red cat", dict(num_inference_steps=3, seed=1, guidance_scale=4.5)), "a", 1.0),
            (Req("green square", dict(num_inference_steps=2, seed=2, guidance_scale=1.0)), None, 1.0),
            (Req("city skyline", dict(num_inference_steps=3, seed=3, guidance_scale=3.0)), "a", 0.5),
        ),
    ),
    LoraRow(
        "flux2_klein",
        "flux2_lora",
        "attention_kwargs",
        (  # [klein]: CFG (separate passes) above scale 1
            (Req("a red cat", dict(num_inference_steps=2, seed=1, guidance_scale=4.0)), "a", 1.0),
            (Req("green square", dict(num_inference_steps=2, seed=2, guidance_scale=1.0)), None, 1.0),
            (Req("city skyline", dict(num_inference_steps=2, seed=3, guidance_scale=1.0)), "a", 0.5),
        ),
    ),
    LoraRow(
        "flux2",
        "flux2_lora",
        "attention_kwargs",
        (  # [dev]: guidance embedding, the same adapter file
            (Req("a red cat", dict(num_inference_steps=2, seed=1, guidance_scale=4.0)), "a", 1.0),
            (Req("green square", dict(num_inference_steps=2, seed=2, guidance_scale=2.5)), None, 1.0),
            (Req("city skyline", dict(num_inference_steps=2, seed=3, guidance_scale=1.5)), "a", 0.5),
        ),
    ),
    # only prompts of one token length share a forward (the batch key): one prompt, three seeds
    LoraRow(
        "qwen_image_21",
        "qwen_image_21_lora",
        "attention_kwargs",
        (
            (Req("a red cat", dict(num_inference_steps=2, seed=1)), "a", 1.0),
            (Req("a red cat", dict(num_inference_steps=2, seed=2)), None, 1.0),
            (Req("a red cat", dict(num_inference_steps=2, seed=3)), "a", 0.5),
        ),
    ),
]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def expected(ref: Any, fam: ImageFamily, row: LoraRow, req: Req, adapter: str | None, scale: float) -> torch.Tensor:
    kw = req.diffusers_kwargs(fam, output_type="latent")
    if adapter is None:
        ref.disable_lora()
        try:
            return ref(prompt=req.prompt, **kw).images
        finally:
            ref.enable_lora()
    ref.set_adapters(adapter)
    return ref(prompt=req.prompt, **{row.scale_kw: {"scale": scale}}, **kw).images


@pytest.mark.parametrize("row", ROWS, ids=str)
async def test_mixed_adapters_equal_diffusers_load_lora_weights(row, tiny_model):
    import diffusers

    fam = by_name(row.family)
    base, lora = str(tiny_model(row.family)), str(tiny_model(row.adapter))
    ref = getattr(diffusers, fam.diffusers_class).from_pretrained(base)
    ref.set_progress_bar_config(disable=True)
    ref.load_lora_weights(lora, adapter_name="a")
    deploy = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent", "lora_modules": [f"a={lora}"]}]}

    def prompt(req: Req, adapter: str | None) -> dict[str, Any]:
        p = req.engine_prompt()
        return {**({"prompt": p} if isinstance(p, str) else p), **({"lora": adapter} if adapter else {})}

    async with AsyncOmni(base, deploy_config=deploy) as omni:
        outs = await asyncio.gather(
            *(
                generate_final(omni, prompt(req, a), req.engine_params(fam, output_type="latent", lora_scale=s))
                for req, a, s in row.cases
            )
        )
        forwards = [ids for _, ids in omni.replicas(0)[0].forward_log]
    assert max(len(ids) for ids in forwards) == len(row.cases)  # the adapter, another scale and none in one forward
    h, w = fam.size["height"], fam.size["width"]
    got = [o.latents if fam.latent_view is None else fam.latent_view(ref, o.latents, h, w) for o in outs]
    for (req, adapter, scale), g in zip(row.cases, got):
        want = expected(ref, fam, row, req, adapter, scale)
        assert g.shape == want.shape and max_diff(g, want) <= 1e-5, (req.prompt, adapter, scale)
    # the adapter changes the result (a no-op adapter would pass the rest)
    assert max_diff(got[0], expected(ref, fam, row, row.cases[0][0], None, 1.0)) > 1e-3
