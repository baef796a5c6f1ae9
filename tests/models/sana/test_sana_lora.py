"""LoRA adapters per request on the tiny Sana, offline through ``AsyncOmni``, against diffusers'
``SanaPipeline`` with ``load_lora_weights`` and ``attention_kwargs={"scale": s}`` (fp32, CPU): requests with
an adapter, another scale and none share forwards and each equals diffusers within 1e-5."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistage import AsyncOmni
from omnistage.testing.staggered import generate_final

SMALL = dict(height=64, width=96, output_type="latent", extra_args={"use_resolution_binning": False})


@pytest.fixture(scope="module")
def folders(tiny_model):
    return str(tiny_model("sana")), str(tiny_model("sana_lora"))


@pytest.fixture(scope="module")
def ref(folders):
    import diffusers

    base, lora = folders
    pipe = diffusers.SanaPipeline.from_pretrained(base)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(lora, adapter_name="a")
    return pipe


def expected(ref, prompt: str, lora: str | None, scale: float, seed: int, **kw) -> torch.Tensor:
    call = dict(height=SMALL["height"], width=SMALL["width"], use_resolution_binning=False, output_type="latent",
                generator=torch.Generator().manual_seed(seed), **kw)
    if lora is None:
        ref.disable_lora()
        try:
            return ref(prompt, **call).images
        finally:
            ref.enable_lora()
    ref.set_adapters(lora)
    return ref(prompt, attention_kwargs={"scale": scale}, **call).images


SPECS = [  # (prompt, adapter, scale, params): CFG and not, the adapter at two scales and none
    ("a red cat", "a", 1.0, dict(num_inference_steps=4, seed=1, guidance_scale=4.5)),
    ("green square", None, 1.0, dict(num_inference_steps=3, seed=2, guidance_scale=1.0)),
    ("city skyline", "a", 0.5, dict(num_inference_steps=4, seed=3, guidance_scale=3.0)),
]


async def test_mixed_adapters_equal_diffusers(folders, ref):
    base, lora = folders
    deploy = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent", "lora_modules": [f"a={lora}"]}]}
    async with AsyncOmni(base, deploy_config=deploy) as omni:
        outs = await asyncio.gather(*(generate_final(omni, {"prompt": p, **({"lora": a} if a else {})},
                                                     {**kw, **SMALL, "lora_scale": s}) for p, a, s, kw in SPECS))
        forwards = [ids for _, ids in omni.replicas(0)[0].forward_log]
    assert max(len(ids) for ids in forwards) == len(SPECS)  # the adapter, another scale and none in one forward
    for (prompt, lora_name, scale, kw), out in zip(SPECS, outs):
        kw = dict(kw)
        want = expected(ref, prompt, lora_name, scale, kw.pop("seed"), **kw)
        assert (out.latents - want).abs().max().item() <= 1e-5, (prompt, lora_name, scale)
    # the adapter changes the result (a no-op adapter would pass the rest)
    plain = expected(ref, SPECS[0][0], None, 1.0, 1, num_inference_steps=4, guidance_scale=4.5)
    assert not torch.allclose(outs[0].latents, plain)
