"""Quantized components of a diffusion stage, built with diffusers' and transformers' own quantizers.

A stage's ``quantization:`` uses the names of diffusers' ``PipelineQuantizationConfig``
(``quant_backend``, ``quant_kwargs``, ``components_to_quantize``). diffusers 0.42's
``PipelineQuantizationConfig(quant_backend="torchao", ...)`` raises (its torchao config wants a
config object, transformers' differs), so every component gets its own config here, of its own
library (a diffusers model: diffusers' config; a transformers text encoder: transformers'), passed
as ``quant_mapping``. torchao's ``quant_type`` is a torchao config class name
(``Int8WeightOnlyConfig``, with its arguments beside it) or a short name people know (``int8wo``).

``single_file`` loads one component from one file (a GGUF download of a FLUX / Qwen-Image / Wan
transformer) with ``from_single_file`` against the folder's config, the rest of the pipeline from
the folder. A folder whose component is saved quantized (``quantization_config`` in its config)
needs no ``quantization:``: diffusers loads it as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from omnistage import torchao_gate
from omnistage.config.stage_sections import QuantizationConfig

BACKENDS = ("torchao", "gguf", "quanto", "bitsandbytes_4bit", "bitsandbytes_8bit")

# short names people know -> torchao's config classes
TORCHAO_SHORT_NAMES = {
    "int8wo": "Int8WeightOnlyConfig",
    "int8_weight_only": "Int8WeightOnlyConfig",
    "float8wo": "Float8WeightOnlyConfig",
    "float8_weight_only": "Float8WeightOnlyConfig",
    "int4wo": "Int4WeightOnlyConfig",
    "int4_weight_only": "Int4WeightOnlyConfig",
    "int8dq": "Int8DynamicActivationInt8WeightConfig",
    "float8dq": "Float8DynamicActivationFloat8WeightConfig",
}
# torchao's config classes that keep weights in float8 but compute in the activations' dtype: torchao's
# float8 weight-only matmul refuses float32 activations (measured: "expected m1 and m2 to have the same dtype")
_FLOAT8_WEIGHT_ONLY = ("Float8WeightOnlyConfig",)
_TORCHAO_OWN = ("modules_to_not_convert",)  # TorchAoConfig's own keywords; the rest go to the torchao class

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class QuantizationError(ValueError):
    """A ``quantization:`` entry that cannot work; the message names the key."""


def _component_libraries(folder: Path) -> dict[str, tuple[str, str]]:
    """model_index.json's components: name -> (library, class)."""
    try:
        index = json.loads((folder / "model_index.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise QuantizationError(f"cannot read {folder / 'model_index.json'}: {e}") from None
    return {
        k: (v[0], v[1])
        for k, v in index.items()
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], str)
    }


def torchao_base_config(kwargs: dict[str, Any], where: str) -> tuple[Any, dict[str, Any]]:
    """torchao's config object named by ``quant_type`` (with the other keys as its arguments) and
    TorchAoConfig's own keywords."""
    torchao_gate.require(where)
    import torchao.quantization as tq

    kwargs = dict(kwargs)
    name = kwargs.pop("quant_type", None)
    if not isinstance(name, str) or not name:
        raise QuantizationError(f"{where}.quant_kwargs.quant_type: required for torchao (e.g. int8wo, float8wo)")
    cls_name = TORCHAO_SHORT_NAMES.get(name, name)
    cls = getattr(tq, cls_name, None)
    if not isinstance(cls, type) or not cls_name.endswith("Config"):
        known = ", ".join(sorted(TORCHAO_SHORT_NAMES))
        raise QuantizationError(
            f"{where}.quant_kwargs.quant_type: {name!r} is neither a torchao config class "
            f"(torchao.quantization.*Config) nor one of {known}"
        )
    own = {k: kwargs.pop(k) for k in _TORCHAO_OWN if k in kwargs}
    try:
        return cls(**kwargs), own
    except TypeError as e:
        raise QuantizationError(f"{where}.quant_kwargs: {cls_name}: {e}") from None


def _dtype(value: Any, where: str) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if value not in _DTYPES:
        raise QuantizationError(f"{where}: {value!r} is not one of {', '.join(_DTYPES)}")
    return _DTYPES[value]


def component_config(q: QuantizationConfig, library: str, dtype: torch.dtype, where: str) -> Any:
    """One component's quantization config object, of its own library."""
    kw = dict(q.quant_kwargs)
    backend = q.quant_backend
    diffusers_side = library == "diffusers"
    try:
        if backend == "torchao":
            base, own = torchao_base_config(kw, where)
            if type(base).__name__ in _FLOAT8_WEIGHT_ONLY and dtype == torch.float32:
                raise QuantizationError(
                    f"{where}.quant_kwargs.quant_type: {type(base).__name__} computes in the activations' dtype and "
                    "torchao's float8 matmul takes no float32: set the stage's dtype to bfloat16 or float16"
                )
            if diffusers_side:
                from diffusers import TorchAoConfig
            else:
                from transformers import TorchAoConfig
            return TorchAoConfig(base, **own)
        if backend == "gguf":
            if not diffusers_side:
                raise QuantizationError(
                    f"{where}.components_to_quantize: gguf loads diffusers models only (a {library} component was named)"
                )
            from diffusers import GGUFQuantizationConfig

            return GGUFQuantizationConfig(compute_dtype=_dtype(kw.pop("compute_dtype", dtype), where))
        if backend == "quanto":
            weights = kw.pop("weights_dtype", kw.pop("weights", "int8"))
            if diffusers_side:
                from diffusers import QuantoConfig

                return QuantoConfig(weights_dtype=weights, **kw)
            from transformers import QuantoConfig

            return QuantoConfig(weights=weights, **kw)
        if backend in ("bitsandbytes_4bit", "bitsandbytes_8bit"):
            flag = "load_in_4bit" if backend.endswith("4bit") else "load_in_8bit"
            if diffusers_side:
                from diffusers import BitsAndBytesConfig
            else:
                from transformers import BitsAndBytesConfig
            return BitsAndBytesConfig(**{flag: True}, **kw)
    except (TypeError, ValueError, ImportError) as e:
        if isinstance(e, QuantizationError):
            raise
        raise QuantizationError(f"{where}.quant_kwargs: {backend}: {e}") from None
    raise QuantizationError(f"{where}.quant_backend: {backend!r} is not one of {', '.join(BACKENDS)}")


def check_environment(q: QuantizationConfig, where: str) -> None:
    """The backend's package is importable (a start-up error naming it, not a failure inside diffusers)."""
    packages = {
        "torchao": "torchao",
        "gguf": "gguf",
        "quanto": "optimum.quanto",
        "bitsandbytes_4bit": "bitsandbytes",
        "bitsandbytes_8bit": "bitsandbytes",
    }
    if q.quant_backend not in packages:
        raise QuantizationError(f"{where}.quant_backend: {q.quant_backend!r} is not one of {', '.join(BACKENDS)}")
    import importlib

    if q.quant_backend == "torchao":
        torchao_gate.require(where)
    try:
        importlib.import_module(packages[q.quant_backend])
    except ImportError as e:
        raise QuantizationError(
            f"{where}.quant_backend: {q.quant_backend} needs the package {packages[q.quant_backend]!r} ({e})"
        ) from None


def load_arguments(q: QuantizationConfig, folder: str | Path, dtype: torch.dtype, where: str) -> dict[str, Any]:
    """``from_pretrained`` keywords that quantize the stage: ``quantization_config`` for the components
    quantized while loading, the loaded component for a ``single_file``."""
    folder = Path(folder)
    check_environment(q, where)
    libraries = _component_libraries(folder)
    for c in q.components_to_quantize:
        if c not in libraries:
            raise QuantizationError(
                f"{where}.components_to_quantize: {c!r} is not a component of {folder} ({', '.join(sorted(libraries))})"
            )
    out: dict[str, Any] = {}
    mapping = {}
    if q.single_file is not None:
        if len(q.components_to_quantize) != 1:
            raise QuantizationError(
                f"{where}.single_file: names one component's file; components_to_quantize lists "
                f"{len(q.components_to_quantize)}"
            )
        component = q.components_to_quantize[0]
        out[component] = load_single_file(q, folder, component, libraries[component], dtype, where)
    else:
        if q.quant_backend == "gguf":
            raise QuantizationError(f"{where}.single_file: gguf loads a component from a .gguf file; name it here")
        for c in q.components_to_quantize:
            mapping[c] = component_config(q, libraries[c][0], dtype, where)
        from diffusers import PipelineQuantizationConfig

        out["quantization_config"] = PipelineQuantizationConfig(quant_mapping=mapping)
    return out


def load_single_file(
    q: QuantizationConfig, folder: Path, component: str, lib_cls: tuple[str, str], dtype: torch.dtype, where: str
) -> torch.nn.Module:
    library, class_name = lib_cls
    path = Path(q.single_file or "")
    if not path.is_file():
        raise QuantizationError(f"{where}.single_file: {str(path)!r} is not a file")
    if library != "diffusers":
        raise QuantizationError(
            f"{where}.single_file: {component} is a {library} model; single files load diffusers models"
        )
    import diffusers

    cls = getattr(diffusers, class_name)
    if not hasattr(cls, "from_single_file"):
        raise QuantizationError(f"{where}.single_file: diffusers' {class_name} does not load single files")
    config = component_config(q, library, dtype, where)
    return cls.from_single_file(
        str(path), config=str(folder), subfolder=component, quantization_config=config, torch_dtype=dtype
    )


def quantized_components(pipe: Any) -> dict[str, str]:
    """The pipeline's components whose weights are quantized: name -> quantization method (diffusers and
    transformers models keep their quantizer's config once quantized)."""
    out = {}
    for name, module in getattr(pipe, "components", {}).items():
        cfg = getattr(getattr(module, "config", None), "quantization_config", None)
        if cfg is None and isinstance(module, torch.nn.Module):
            cfg = getattr(getattr(module, "hf_quantizer", None), "quantization_config", None)
        if cfg is not None:
            method = cfg.get("quant_method") if isinstance(cfg, dict) else getattr(cfg, "quant_method", None)
            out[name] = str(getattr(method, "value", method))
    return out


def check_stage(kind: str, sd: Any, where: str) -> None:
    """Start-up checks of a stage's ``quantization:`` that need no model folder (``sd``: its deploy entry)."""
    q = sd.quantization
    if q is None:
        return
    if kind not in ("llm", "diffusion"):
        raise QuantizationError(f"{where}: only llm and diffusion stages take it (this stage is {kind})")
    if kind != "diffusion":
        if not isinstance(q, str):
            raise QuantizationError(
                f"{where}: a {kind} stage takes vLLM's method name (e.g. fp8, awq, gptq, gguf), not a mapping"
            )
        if q == "torchao":  # vLLM's engine processes, started after this, import it
            torchao_gate.require(where)
        return
    if isinstance(q, str):
        raise QuantizationError(
            f"{where}: a diffusion stage takes a mapping (quant_backend, quant_kwargs, components_to_quantize), "
            f"e.g. {{quant_backend: torchao, quant_kwargs: {{quant_type: int8wo}}}}; got {q!r}"
        )
    check_environment(q, where)
    if q.quant_backend == "torchao":
        torchao_base_config(q.quant_kwargs, where)
    if q.quant_backend == "gguf" and q.single_file is None:
        raise QuantizationError(f"{where}.single_file: gguf loads a component from a .gguf file; name it here")
    if q.single_file is not None and not Path(q.single_file).is_file():
        raise QuantizationError(f"{where}.single_file: {q.single_file!r} is not a file")
    if sd.lora_enabled:
        raise QuantizationError(
            f"{where}: per-request LoRA (lora_modules / enable_lora) is not available on a quantized stage "
            f"({q.quant_backend}): its layers hook the transformer's nn.Linear weights in their own dtype"
        )
