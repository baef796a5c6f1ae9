"""Quantized diffusion stages (deploy ``quantization:``) against diffusers' own pipeline loaded with the same
quantization config: torchao int8 / float8 weight-only, quanto int8, and a single-file GGUF transformer (Q8_0,
Q4_0) written by the fixture builder. Solo requests equal diffusers' ``__call__`` (same seed); requests batched
together equal their solo runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage import AsyncOmni
from omnistage.config.loader import ConfigError
from omnistage.engine.builder import resolve_deploy
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.gguf_files import write_gguf
from omnistage.testing.staggered import generate_final, solo_then_staggered

# FLUX: 32x32 pixels -> 2x2 packed tokens, a short T5 length; 8 steps, so that a request submitted after another's
# first step joins it while it runs; Qwen-Image: 32x32 too
FLUX_REQ = dict(height=32, width=32, max_sequence_length=32, num_inference_steps=8, output_type="latent")
QWEN_REQ = dict(height=32, width=32, num_inference_steps=3, output_type="latent")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def torchao(quant_type: str) -> dict:
    return {"quant_backend": "torchao", "quant_kwargs": {"quant_type": quant_type}}


def deploy(quantization: dict, dtype: str = "float32") -> dict:
    return {"stages": [{"stage_id": 0, "dtype": dtype, "engine_output_type": "latent", "quantization": quantization}]}


def diffusers_quant_config(method: str):
    """The same quantization written the way diffusers' docs write it (per component, diffusers' classes)."""
    from diffusers import PipelineQuantizationConfig, QuantoConfig, TorchAoConfig
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig

    cfg = {
        "int8wo": lambda: TorchAoConfig(Int8WeightOnlyConfig()),
        "Float8WeightOnlyConfig": lambda: TorchAoConfig(Float8WeightOnlyConfig()),
        "quanto-int8": lambda: QuantoConfig(weights_dtype="int8"),
    }[method]()
    return PipelineQuantizationConfig(quant_mapping={"transformer": cfg})


@pytest.fixture(scope="module")
def flux_dev(tiny_model) -> str:
    return str(tiny_model("flux"))


@pytest.fixture(scope="module")
def qwen_image(tiny_model) -> str:
    return str(tiny_model("qwen_image"))


def flux_reference(folder: str, dtype: torch.dtype, **kw):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(folder, torch_dtype=dtype, **kw)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def flux_call(pipe, prompt: str, seed: int) -> torch.Tensor:
    return pipe(prompt, generator=gen(seed), **FLUX_REQ).images


def diffusers_batch_effect(pipe, specs) -> float:
    """How far diffusers' own rows move when the requests run as one batch instead of alone."""
    prompts = [p for p, _ in specs]
    kw = {k: v for k, v in specs[0][1].items() if k != "seed"}
    together = pipe(prompts, generator=[gen(k["seed"]) for _, k in specs], **kw).images
    return max(
        max_diff(together[i : i + 1], pipe(p, generator=gen(k["seed"]), **kw).images) for i, (p, k) in enumerate(specs)
    )


def batch_tol(ref, specs, solo, together) -> None:
    """A batch's rows equal their solo runs within float32 rounding of the quantized matmul over 1 vs 2 rows.
    Measured over 8 steps: ours up to 4.8e-7 (the requests share some of the steps), diffusers' own rows with the
    same config up to 2.4e-7 when its batch shares all of them (a few float32 ulps at |latent| ~ 2)."""
    assert diffusers_batch_effect(ref, specs) <= 1e-6
    for s, t in zip(solo, together):
        assert max_diff(s.latents, t.latents) <= 1e-6


CASES = [
    ("int8wo", torchao("int8wo"), "float32"),
    ("Float8WeightOnlyConfig", torchao("Float8WeightOnlyConfig"), "bfloat16"),
    ("quanto-int8", {"quant_backend": "quanto", "quant_kwargs": {"weights_dtype": "int8"}}, "float32"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "quantization", "dtype"), CASES, ids=[c[0] for c in CASES])
async def test_quantized_flux_equals_diffusers_solo_and_batched(flux_dev, method, quantization, dtype):
    torch_dtype = getattr(torch, dtype)
    ref = flux_reference(flux_dev, torch_dtype, quantization_config=diffusers_quant_config(method))
    plain = flux_reference(flux_dev, torch_dtype)
    specs = [("a red cat", {**FLUX_REQ, "seed": 3}), ("a blue boat at dawn", {**FLUX_REQ, "seed": 4})]
    async with AsyncOmni(flux_dev, deploy_config=deploy(quantization, dtype)) as omni:
        pipe = omni.replicas(0)[0].adapter.pipe
        assert type(pipe.transformer.transformer_blocks[0].attn.to_q.weight) is type(
            ref.transformer.transformer_blocks[0].attn.to_q.weight
        )
        solo, together, forwards = await solo_then_staggered(omni, specs)
    for (prompt, kw), out in zip(specs, solo):
        expected = flux_call(ref, prompt, kw["seed"])
        assert max_diff(out.latents, expected) == 0.0
        # and quantization did change the numbers (the config reached the transformer)
        assert max_diff(out.latents, flux_call(plain, prompt, kw["seed"])) > 0
    assert any(len(ids) == 2 for ids in forwards), forwards  # the two requests shared forwards
    batch_tol(ref, specs, solo, together)


@pytest.fixture(scope="module")
def flux_gguf(flux_dev, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("gguf")
    return {q: write_gguf(flux_dev, "transformer", q, out / f"flux-{q}.gguf") for q in ("Q8_0", "Q4_0")}


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
async def test_gguf_flux_transformer_equals_diffusers_from_single_file(flux_dev, flux_gguf, qtype):
    from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig

    path = flux_gguf[qtype]
    transformer = FluxTransformer2DModel.from_single_file(
        str(path),
        config=flux_dev,
        subfolder="transformer",
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32),
        torch_dtype=torch.float32,
    )
    ref = flux_reference(flux_dev, torch.float32, transformer=transformer)
    quantization = {"quant_backend": "gguf", "quant_kwargs": {"compute_dtype": "float32"}, "single_file": str(path)}
    specs = [("a red cat", {**FLUX_REQ, "seed": 3}), ("a green hill", {**FLUX_REQ, "seed": 8})]
    async with AsyncOmni(flux_dev, deploy_config=deploy(quantization)) as omni:
        layer = omni.replicas(0)[0].adapter.pipe.transformer.transformer_blocks[0].attn.to_q
        assert type(layer).__name__ == "GGUFLinear" and layer.weight.quant_type.name == qtype
        solo, together, forwards = await solo_then_staggered(omni, specs)
    for (prompt, kw), out in zip(specs, solo):
        assert max_diff(out.latents, flux_call(ref, prompt, kw["seed"])) == 0.0
    assert any(len(ids) == 2 for ids in forwards), forwards
    batch_tol(ref, specs, solo, together)


@pytest.mark.slow
async def test_gguf_qwen_image_transformer_equals_diffusers(qwen_image, tmp_path):
    from diffusers import GGUFQuantizationConfig, QwenImagePipeline, QwenImageTransformer2DModel

    path = write_gguf(qwen_image, "transformer", "Q4_0", tmp_path / "qwen-image-Q4_0.gguf")
    transformer = QwenImageTransformer2DModel.from_single_file(
        str(path),
        config=qwen_image,
        subfolder="transformer",
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32),
        torch_dtype=torch.float32,
    )
    ref = QwenImagePipeline.from_pretrained(qwen_image, transformer=transformer)
    ref.set_progress_bar_config(disable=True)
    quantization = {"quant_backend": "gguf", "single_file": str(path)}  # compute dtype: the stage's
    async with AsyncOmni(qwen_image, deploy_config=deploy(quantization)) as omni:
        out = await generate_final(omni, "a small house", {**QWEN_REQ, "seed": 5})
    expected = ref("a small house", generator=gen(5), **QWEN_REQ).images
    assert max_diff(out.latents, expected) == 0.0


# ------------------------------------------------------------------ start-up refusals


def resolve(folder: str, stage: dict):
    return resolve_deploy(resolve_pipeline(folder), {"stages": [{"stage_id": 0, **stage}]})


def test_quantization_in_stage_overrides_reaches_the_stage(flux_dev):
    pipeline = resolve_pipeline(flux_dev)
    d = resolve_deploy(
        pipeline,
        None,
        stage_overrides='{"0": {"quantization": {"quant_backend": "torchao", '
        '"quant_kwargs": {"quant_type": "int8wo"}}}}',
    )
    q = d.stage(0).quantization
    assert q.quant_backend == "torchao" and q.components_to_quantize == ["transformer"]


@pytest.mark.parametrize(
    ("stage", "words"),
    [
        ({"quantization": "fp8"}, ["stages[0].quantization", "mapping"]),
        ({"quantization": torchao("int3wo")}, ["stages[0].quantization.quant_kwargs.quant_type", "int3wo"]),
        ({"quantization": {"quant_backend": "torchao"}}, ["quant_type", "required"]),
        ({"quantization": {"quant_backend": "fp4magic", "quant_kwargs": {}}}, ["quant_backend", "fp4magic"]),
        ({"quantization": {"quant_backend": "gguf"}}, ["stages[0].quantization.single_file", ".gguf"]),
        (
            {"quantization": {"quant_backend": "gguf", "single_file": "/nonexistent/flux-Q4_0.gguf"}},
            ["single_file", "not a file"],
        ),
        ({"quantization": torchao("int8wo"), "enable_lora": True}, ["LoRA", "torchao"]),
        ({"quantization": {**torchao("int8wo"), "unknown_key": 1}}, ["unknown_key"]),
    ],
)
def test_bad_quantization_is_refused_at_start_up_naming_the_key(flux_dev, stage, words):
    with pytest.raises(ConfigError) as e:
        resolve(flux_dev, stage)
    for w in words:
        assert w in str(e.value), str(e.value)


async def test_float8_weight_only_in_float32_is_refused_before_serving(flux_dev):
    with pytest.raises(Exception) as e:
        async with AsyncOmni(flux_dev, deploy_config=deploy(torchao("float8wo"), "float32")):
            pass
    assert "Float8WeightOnlyConfig" in str(e.value) and "bfloat16" in str(e.value), str(e.value)


async def test_unknown_component_is_refused_naming_the_folder_s_components(flux_dev):
    with pytest.raises(Exception) as e:
        async with AsyncOmni(flux_dev, deploy_config=deploy({**torchao("int8wo"), "components_to_quantize": ["unet"]})):
            pass
    assert "components_to_quantize" in str(e.value) and "'unet'" in str(e.value) and "transformer" in str(e.value)


@pytest.mark.slow
async def test_step_cache_runs_on_a_quantized_transformer(flux_dev):
    """The per-request step cache hooks the quantized transformer's blocks as it does a plain one's: cached
    steps are reused, a batch's rows equal their solo runs, and a ``cache: false`` request stays diffusers'."""
    ref = flux_reference(flux_dev, torch.float32, quantization_config=diffusers_quant_config("int8wo"))
    stage = deploy(torchao("int8wo"))
    # every other step reused after the first (a threshold no change reaches)
    stage["stages"][0]["acceleration"] = {
        "cache": {"method": "first_block", "threshold": 1e9, "warmup_steps": 1, "max_consecutive_cached": 1}
    }
    kw = {**FLUX_REQ, "num_inference_steps": 5}
    specs = [
        ("a red cat", {**kw, "seed": 3}),
        ("a blue boat", {**kw, "seed": 4}),
        ("off", {**kw, "seed": 5, "cache": False}),
    ]
    async with AsyncOmni(flux_dev, deploy_config=stage) as omni:
        solo, together, forwards = await solo_then_staggered(omni, specs)
    assert any(len(ids) >= 2 for ids in forwards), forwards
    for (prompt, _), s, t in zip(specs, solo, together):
        assert (s.metrics[0]["num_steps_reused"] > 0) == (prompt != "off")
        assert t.metrics[0]["num_steps_reused"] == s.metrics[0]["num_steps_reused"]
        # within float32 rounding of the 2- vs 3-row quantized matmul (diffusers' own batch effect is 1.2e-7)
        assert max_diff(s.latents, t.latents) <= 1e-6
    assert max_diff(solo[2].latents, ref("off", generator=gen(5), **{**kw, "num_inference_steps": 5}).images) == 0.0


@pytest.fixture(scope="module")
def prequantized_flux(flux_dev, tmp_path_factory) -> str:
    """A FLUX folder whose transformer diffusers saved torchao-quantized (``quantization_config`` in its config)."""
    import shutil

    from diffusers import FluxTransformer2DModel

    out = tmp_path_factory.mktemp("prequantized") / "flux"
    shutil.copytree(flux_dev, out, ignore=shutil.ignore_patterns("transformer"))
    transformer = FluxTransformer2DModel.from_pretrained(
        flux_dev,
        subfolder="transformer",
        quantization_config=diffusers_quant_config("int8wo").quant_mapping["transformer"],
    )
    transformer.save_pretrained(out / "transformer")
    return str(out)


@pytest.mark.slow
async def test_prequantized_folder_loads_as_it_is(prequantized_flux):
    import json

    assert json.loads((Path(prequantized_flux) / "transformer" / "config.json").read_text())["quantization_config"]
    ref = flux_reference(prequantized_flux, torch.float32)
    async with AsyncOmni(
        prequantized_flux, deploy_config={"stages": [{"stage_id": 0, "engine_output_type": "latent"}]}
    ) as omni:
        weight = omni.replicas(0)[0].adapter.pipe.transformer.transformer_blocks[0].attn.to_q.weight
        assert type(weight).__name__ == "Int8Tensor"
        out = await generate_final(omni, "a red cat", {**FLUX_REQ, "seed": 3})
    assert max_diff(out.latents, flux_call(ref, "a red cat", 3)) == 0.0


@pytest.mark.slow
async def test_text_encoder_quantized_with_transformers_own_config(flux_dev):
    """A transformers text encoder in ``components_to_quantize`` gets transformers' TorchAoConfig (diffusers' would
    not load it), the transformer diffusers'."""
    import diffusers
    import transformers
    from torchao.quantization import Int8WeightOnlyConfig

    mapping = {
        "transformer": diffusers.TorchAoConfig(Int8WeightOnlyConfig()),
        "text_encoder_2": transformers.TorchAoConfig(Int8WeightOnlyConfig()),
    }
    ref = flux_reference(
        flux_dev, torch.float32, quantization_config=diffusers.PipelineQuantizationConfig(quant_mapping=mapping)
    )
    quantization = {**torchao("int8wo"), "components_to_quantize": ["transformer", "text_encoder_2"]}
    async with AsyncOmni(flux_dev, deploy_config=deploy(quantization)) as omni:
        t5 = omni.replicas(0)[0].adapter.pipe.text_encoder_2
        assert type(t5.encoder.block[0].layer[0].SelfAttention.q.weight).__name__ == "Int8Tensor"
        out = await generate_final(omni, "a red cat", {**FLUX_REQ, "seed": 3})
    assert max_diff(out.latents, flux_call(ref, "a red cat", 3)) == 0.0
