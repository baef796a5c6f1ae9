"""LoRA adapters per request on the tiny FLUX.1-dev, offline through ``AsyncOmni`` (``lora`` in the prompt
dict, ``lora_scale`` in the stage params), against diffusers' ``FluxPipeline`` with ``load_lora_weights`` and
``joint_attention_kwargs={"scale": s}`` (fp32, CPU). The fixture adapter has per-layer ranks and kohya-style
alphas; true CFG runs its negative pass as a separate forward, with the request's adapter too."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models.flux.tiny import build_lora
from omnistage.testing.staggered import generate_final

SMALL = dict(height=32, width=48, max_sequence_length=32, output_type="latent")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.fixture(scope="module")
def dev(tiny_model):
    return str(tiny_model("flux"))


@pytest.fixture(scope="module")
def loras(tiny_model, tmp_path_factory):
    other = tmp_path_factory.mktemp("flux-lora-b")
    build_lora(other, seed=5, rank=2, single_rank=4, alpha=1.0)
    return {"a": str(tiny_model("flux_lora")), "b": str(other)}


@pytest.fixture(scope="module")
def ref(dev, loras):
    import diffusers

    pipe = diffusers.FluxPipeline.from_pretrained(dev)
    pipe.set_progress_bar_config(disable=True)
    for name, path in loras.items():
        pipe.load_lora_weights(path, adapter_name=name)
    return pipe


def expected(ref, prompt: dict, lora: str | None, scale: float, seed: int, **kw) -> torch.Tensor:
    kw = {k: v for k, v in kw.items() if k != "output_type"}
    if lora is None:
        ref.disable_lora()
        try:
            return ref(
                prompt["prompt"],
                negative_prompt=prompt.get("negative_prompt"),
                generator=gen(seed),
                output_type="latent",
                **kw,
            ).images
        finally:
            ref.enable_lora()
    ref.set_adapters(lora)
    return ref(
        prompt["prompt"],
        negative_prompt=prompt.get("negative_prompt"),
        generator=gen(seed),
        output_type="latent",
        joint_attention_kwargs={"scale": scale},
        **kw,
    ).images


def deploy(loras: dict[str, str]) -> dict:
    return {
        "stages": [
            {
                "stage_id": 0,
                "engine_output_type": "image,latent",
                "max_num_seqs": 16,
                "lora_modules": [{"name": n, "path": p} for n, p in loras.items()],
            }
        ]
    }


SPECS = [  # (prompt, adapter, scale, params)
    ({"prompt": "a red cat"}, "a", 1.0, dict(num_inference_steps=5, seed=1, guidance_scale=3.5)),
    (
        {"prompt": "green square", "negative_prompt": "blurry"},
        "b",
        0.7,
        dict(num_inference_steps=4, seed=2, guidance_scale=2.0, true_cfg_scale=4.0),
    ),
    ({"prompt": "city skyline"}, None, 1.0, dict(num_inference_steps=5, seed=3, guidance_scale=5.0)),
    (
        {"prompt": "a blue chair", "negative_prompt": "dark"},
        "a",
        0.4,
        dict(num_inference_steps=3, seed=4, guidance_scale=1.0, true_cfg_scale=2.5),
    ),
]


async def test_mixed_adapters_equal_diffusers(dev, ref, loras):
    async with AsyncOmni(dev, deploy_config=deploy(loras)) as omni:
        solo = await generate_final(omni, {**SPECS[0][0], "lora": "a"}, {**SPECS[0][3], **SMALL})
        outs = await asyncio.gather(
            *(
                generate_final(omni, {**p, **({"lora": lora} if lora else {})}, {**kw, **SMALL, "lora_scale": s})
                for p, lora, s, kw in SPECS
            )
        )
        forwards = [ids for _, ids in omni.replicas(0)[0].forward_log]
    assert max(len(ids) for ids in forwards) == len(SPECS)  # adapters a, b and none in one forward
    for (prompt, lora, scale, kw), out in zip(SPECS, outs):
        kw = dict(kw)
        want = expected(ref, prompt, lora, scale, kw.pop("seed"), **kw, **SMALL)
        assert max_diff(out.latents, want) <= 1e-5, (prompt, lora, scale)
    want = expected(ref, SPECS[0][0], "a", 1.0, 1, **{k: v for k, v in SPECS[0][3].items() if k != "seed"}, **SMALL)
    assert max_diff(solo.latents, want) <= 1e-5


async def test_unknown_adapter_names_model(dev, loras):
    async with AsyncOmni(dev, deploy_config=deploy(loras)) as omni:
        with pytest.raises(InvalidRequestError) as e:
            await generate_final(omni, {"prompt": "a red cat", "lora": "nope"}, {"num_inference_steps": 2, **SMALL})
    assert e.value.field == "model" and "'nope' is not loaded" in str(e.value)
