"""The memory plan (``omnistage plan``, ``serve`` start-up): weight bytes computed from file headers equal the bytes
of the tensors diffusers / transformers load (plain, torchao int8, GGUF Q4_0, an llm checkpoint), and a deploy
that cannot fit is refused naming the stage, the bytes and what to change."""

from __future__ import annotations

import pytest
import torch

from omnistage import AsyncOmni
from omnistage.cli.main import main
from omnistage.memory_plan import parse_bytes, plan_memory
from omnistage.testing.gguf_files import write_gguf


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes the module's parameters hold, a quantized tensor subclass counted by its inner tensors."""
    total = 0
    for p in module.parameters():
        data = p.data if isinstance(p, torch.nn.Parameter) else p
        if hasattr(data, "__tensor_flatten__") and type(data) is not torch.Tensor:
            names, _ = data.__tensor_flatten__()
            total += sum(getattr(data, n).nbytes for n in names)
        else:
            total += data.untyped_storage().nbytes() if type(data).__name__ == "GGUFParameter" else data.nbytes
    return total


@pytest.fixture(scope="module")
def flux(tiny_model) -> str:
    return str(tiny_model("flux"))


def plan_for(folder: str, deploy: dict | None = None, device_memory: int | None = None, **kw):
    omni = AsyncOmni(folder, deploy_config=deploy)
    return plan_memory(omni.pipeline, omni.deploy, omni.model, device_memory, **kw)


def parts(plan) -> dict[str, int]:
    return {name.split(" ")[0]: b for name, b in plan.stages[0].parts}


def test_parse_bytes():
    assert parse_bytes("80GiB") == 80 << 30
    assert parse_bytes("24GB") == 24 * 10**9
    assert parse_bytes("1.5 MiB") == 3 << 19
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_diffusion_weight_bytes_equal_the_loaded_tensors(flux):
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(flux, torch_dtype=torch.float32)
    got = parts(plan_for(flux, {"stages": [{"stage_id": 0, "dtype": "float32"}]}))
    for name in ("transformer", "text_encoder", "text_encoder_2", "vae"):
        assert got[name] == tensor_bytes(getattr(pipe, name)), name


def test_torchao_int8_weight_bytes_equal_the_quantized_tensors(flux):
    from diffusers import FluxTransformer2DModel, TorchAoConfig
    from torchao.quantization import Int8WeightOnlyConfig

    t = FluxTransformer2DModel.from_pretrained(
        flux,
        subfolder="transformer",
        quantization_config=TorchAoConfig(Int8WeightOnlyConfig()),
        torch_dtype=torch.float32,
    )
    q = {"quant_backend": "torchao", "quant_kwargs": {"quant_type": "int8wo"}}
    got = parts(plan_for(flux, {"stages": [{"stage_id": 0, "dtype": "float32", "quantization": q}]}))
    actual = tensor_bytes(t)
    rows = sum(p.shape[0] for p in t.parameters() if p.ndim == 2)
    # torchao gives some layers an int8 zero point per row beside the float32 scale (which ones is its choice:
    # measured, the embedders and AdaLN linears here); the plan counts both for every layer: at most one byte
    # per row over
    assert actual <= got["transformer"] <= actual + rows
    plain = parts(plan_for(flux, {"stages": [{"stage_id": 0, "dtype": "float32"}]}))["transformer"]
    assert got["transformer"] < plain


def test_gguf_weight_bytes_equal_the_loaded_tensors(flux, tmp_path):
    from diffusers import FluxTransformer2DModel, GGUFQuantizationConfig

    path = write_gguf(flux, "transformer", "Q4_0", tmp_path / "t.gguf")
    t = FluxTransformer2DModel.from_single_file(
        str(path),
        config=flux,
        subfolder="transformer",
        quantization_config=GGUFQuantizationConfig(compute_dtype=torch.float32),
        torch_dtype=torch.float32,
    )
    q = {"quant_backend": "gguf", "single_file": str(path)}
    got = parts(plan_for(flux, {"stages": [{"stage_id": 0, "dtype": "float32", "quantization": q}]}))
    assert got["transformer"] == tensor_bytes(t)


def test_llm_weight_bytes_equal_the_loaded_model(tiny_model):
    from transformers import AutoModelForCausalLM

    folder = str(tiny_model("chat"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    plan = plan_for(folder, {"stages": [{"stage_id": 0, "dtype": "float32"}]})
    assert plan.stages[0].weight_bytes == tensor_bytes(model)


def test_plan_cli_refuses_a_deploy_that_cannot_fit_naming_the_stage(flux, capsys):
    assert main(["plan", flux, "--device-memory", "80GiB", "--max-image-pixels", "65536"]) == 0
    assert "fits" in capsys.readouterr().out
    # the default size cap (4096x4096) with 8 rows: the activation estimate alone exceeds a 1 GiB device
    assert main(["plan", flux, "--device-memory", "1GiB"]) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out and "stage 0" in out and "max_num_seqs" in out and "transformer" in out


def test_serve_refuses_before_any_engine_starts(flux, capsys):
    # weights alone (0.34 MiB) above a 100 KiB device: refused at once, exit status 2, nothing started
    assert main(["serve", flux, "--device-memory", "100KiB", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "stage 0" in err and "quantize" in err


def test_llm_weights_above_their_gpu_memory_utilization_share(tiny_model):
    folder = str(tiny_model("chat"))
    plan = plan_for(
        folder, {"stages": [{"stage_id": 0, "gpu_memory_utilization": 0.5}]}, device_memory=parse_bytes("100KiB")
    )
    assert not plan.fits
    assert any("stage 0 (llm)" in p and "gpu_memory_utilization" in p for p in plan.problems), plan.problems
