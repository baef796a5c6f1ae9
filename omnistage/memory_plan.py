"""Whether a deploy fits its devices, computed before anything loads (``omnistage plan``, ``serve`` start-up).

Per stage and device: the weight bytes the stage will hold (read from the safetensors headers and GGUF tensor
tables, after the stage's quantization and dtype; no tensor is read), and the budget it takes beside them:

- llm stages: vLLM takes ``gpu_memory_utilization`` x the device (0.9 when unset) for weights, activations
  and KV cache together; with ``kv_cache_memory_bytes`` it takes the weights plus that many bytes of KV cache;
- diffusion stages: an estimate of the peak activation memory of their largest batch (``max_num_seqs`` rows,
  CFG doubling them) at the largest size the server takes (``max_image_pixels``; video: ``max_num_frames``):
  the transformer's ``12 x rows x tokens x hidden`` values (the residual stream, its norm, q/k/v, the attention
  output and the 4x-wide MLP hidden state alive at once, with memory-efficient attention) or the VAE decoder's
  ``3 x rows x pixels x frames x channels`` at full resolution, whichever is larger (they never run together).

Weight rules: float tensors take the stage's dtype (``auto``: bfloat16, what a GPU deploy loads); a quantized
component's 2-D ``*.weight`` tensors (its linear layers) take the method's bytes per value plus its per-row
scales; a pre-quantized folder or checkpoint counts the bytes it stores.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnistage.config.schema import DeployConfig, StageDeployConfig
from omnistage.config.stage_sections import QuantizationConfig
from omnistage.pipeline import Pipeline

GIB = 1 << 30
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
DEFAULT_DIFFUSION_ROWS = 8  # the diffusion engine's batch when max_num_seqs is unset
_TEXT_TOKENS = 512  # the longest text sequence of the DiT families (T5 / Qwen2.5-VL prompts)
_ACTIVATION_COPIES = 12
_VAE_COPIES = 3
_TILE_PIXELS = 512 * 512  # diffusers' VAE tile

_ST_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
_ST_SIZES |= {"F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2}

# bytes per quantized value and per-row scale bytes, per method (torchao and quanto keep a float32 scale per row)
_TORCHAO_BYTES = {
    "Int8WeightOnlyConfig": 1.0,
    "Int8DynamicActivationInt8WeightConfig": 1.0,
    "Float8WeightOnlyConfig": 1.0,
    "Float8DynamicActivationFloat8WeightConfig": 1.0,
    "Int4WeightOnlyConfig": 0.5,
}
_QUANTO_BYTES = {"int8": 1.0, "float8": 1.0, "int4": 0.5, "int2": 0.25}
_VLLM_ONE_BYTE = re.compile(r"fp8|int8|experts_int8|mxfp8")  # online methods that store one byte per weight


def parse_bytes(text: str) -> int:
    """``80GiB``, ``24 GB``, ``1.5TiB``, ``1000000`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)B?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size (e.g. 80GiB, 24GB)")
    value, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = " KMGT".index(unit or " ")
    return int(value * ((1024 if binary or not unit else 1000) ** power))


def human(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 100 else f"{n / (1 << 20):.2f} MiB"


# ---------------------------------------------------------------------- tensor tables (no tensor read)


def safetensors_table(folder: Path) -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) of every tensor in the folder's ``*.safetensors`` files, from their headers."""
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                yield name, info["dtype"], tuple(info["shape"])


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _is_float(dtype: str) -> bool:
    return dtype in ("F64", "F32", "F16", "BF16")


def _is_linear_weight(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and name.endswith(".weight")


def component_weight_bytes(
    folder: Path, dtype_bytes: int, quantization: QuantizationConfig | None, pre_quantized: bool
) -> int:
    """One diffusers / transformers component's weight bytes once loaded."""
    total = 0
    for name, dt, shape in safetensors_table(folder):
        numel = _numel(shape)
        if pre_quantized or not _is_float(dt):
            total += numel * _ST_SIZES.get(dt, 4)
        elif quantization is not None and _is_linear_weight(name, shape):
            total += quantized_bytes(quantization, shape, dtype_bytes)
        else:
            total += numel * dtype_bytes
    return total


def quantized_bytes(q: QuantizationConfig, shape: tuple[int, ...], dtype_bytes: int) -> int:
    rows, numel = shape[0], _numel(shape)
    if q.quant_backend == "torchao":
        from omnistage.stages.diffusion.quantization import TORCHAO_SHORT_NAMES

        name = str(q.quant_kwargs.get("quant_type", ""))
        per = _TORCHAO_BYTES.get(TORCHAO_SHORT_NAMES.get(name, name), dtype_bytes)
        return int(numel * per) + rows * 5  # a float32 scale per row, and some layers an int8 zero point
    if q.quant_backend == "quanto":
        per = _QUANTO_BYTES.get(str(q.quant_kwargs.get("weights_dtype", q.quant_kwargs.get("weights", "int8"))), 1.0)
        return int(numel * per) + rows * 4
    if q.quant_backend == "bitsandbytes_8bit":
        return numel + rows * 4
    if q.quant_backend == "bitsandbytes_4bit":
        return numel // 2 + (numel // 64) * 4  # 4-bit values, a float32 absmax per 64-value block
    return numel * dtype_bytes


def gguf_weight_bytes(path: Path, dtype_bytes: int) -> int:
    """A single-file GGUF component: quantized tensors as stored, the rest in the compute dtype."""
    import gguf

    total = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            total += int(t.n_elements) * dtype_bytes
        else:
            total += int(t.n_bytes)
    return total


# ---------------------------------------------------------------------- the plan


@dataclass
class StagePlan:
    stage_id: int
    kind: str
    devices: list[str]  # every device of every replica
    weight_bytes: int  # per device
    budget_bytes: int  # per device, beside (llm with kv_cache_memory_bytes, diffusion) or including the weights
    budget_includes_weights: bool  # vLLM's gpu_memory_utilization share holds the weights too
    budget_note: str
    parts: list[tuple[str, int]] = field(default_factory=list)

    @property
    def per_device(self) -> int:
        return self.budget_bytes if self.budget_includes_weights else self.weight_bytes + self.budget_bytes


@dataclass
class MemoryPlan:
    stages: list[StagePlan]
    device_memory: int | None
    problems: list[str]

    @property
    def fits(self) -> bool:
        return not self.problems

    def device_totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.stages:
            for d in s.devices:
                out[d] = out.get(d, 0) + s.per_device
        return out

    def format(self) -> str:
        lines = ["stage  kind       devices   weights      budget       per device   budget is"]
        for s in self.stages:
            lines.append(
                f"{s.stage_id:<6} {s.kind:<10} {','.join(s.devices):<9} {human(s.weight_bytes):<12} "
                f"{human(s.budget_bytes):<12} {human(s.per_device):<12} {s.budget_note}"
            )
            for name, b in s.parts:
                lines.append(f"{'':<6} {'':<10} {'':<9} {human(b):<12} {name}")
        dev = human(self.device_memory) if self.device_memory else "unknown (pass --device-memory)"
        for d, total in sorted(self.device_totals().items()):
            lines.append(f"device {d}: {human(total)} of {dev}")
        lines.extend(f"does not fit: {p}" for p in self.problems)
        if self.fits:
            lines.append("fits" if self.device_memory else "no device size given: nothing checked")
        return "\n".join(lines)


def _stage_devices(sd: StageDeployConfig) -> list[str]:
    devices = sd.device_list
    return devices if devices is not None else [str(i) for i in range(sd.devices_per_replica * sd.replicas)]


def _dtype_bytes(name: str | None) -> int:
    if name in (None, "auto"):
        return 2  # what a GPU deploy loads: bfloat16
    return _DTYPE_BYTES.get(name, 2)


def _diffusion_plan(
    spec: Any, sd: StageDeployConfig, folder: Path, limits: dict[str, int], activations: bool = True
) -> StagePlan:
    dtype_bytes = _dtype_bytes(sd.dtype)
    q = sd.quantization if isinstance(sd.quantization, QuantizationConfig) else None
    index = json.loads((folder / "model_index.json").read_text())
    adapter = spec.adapter
    skipped = set(getattr(adapter, "skip_components", ()))
    if hasattr(adapter, "pipeline_kwargs"):
        skipped |= {k for k, v in adapter.pipeline_kwargs(str(folder)).items() if v is None}
    parts = []
    for comp, entry in index.items():
        if comp in skipped or not isinstance(entry, list) or entry[0] not in ("diffusers", "transformers"):
            continue
        sub = folder / comp
        config = {}
        if (sub / "config.json").is_file():
            config = json.loads((sub / "config.json").read_text())
        quantized = q is not None and comp in q.components_to_quantize
        if quantized and q.single_file is not None:
            if q.quant_backend == "gguf":
                b = gguf_weight_bytes(Path(q.single_file), dtype_bytes)
            else:
                b = component_weight_bytes(Path(q.single_file).parent, dtype_bytes, q, False)
        elif sub.is_dir():
            b = component_weight_bytes(sub, dtype_bytes, q if quantized else None, "quantization_config" in config)
        else:
            continue
        if b:
            parts.append((comp + (f" ({q.quant_backend})" if quantized else ""), b))
    weights = sum(b for _, b in parts)
    peak, note = diffusion_peak(folder, sd, spec, dtype_bytes, limits) if activations else (0, "weights only")
    return StagePlan(spec.stage_id, "diffusion", _stage_devices(sd), weights, peak, False, note, parts)


def _config(folder: Path, name: str) -> dict[str, Any]:
    p = folder / name / "config.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def diffusion_peak(
    folder: Path, sd: StageDeployConfig, spec: Any, dtype_bytes: int, limits: dict[str, int]
) -> tuple[int, str]:
    """The activation peak estimate of the module docstring, and how it was made."""
    rows = (sd.max_num_seqs or DEFAULT_DIFFUSION_ROWS) * 2  # CFG: an uncond row per cond row
    pixels = limits["max_image_pixels"]
    video = "video" in (sd.engine_output_type or spec.output or "")
    frames = limits["max_num_frames"] if video else 1
    vae = _config(folder, "vae")
    channels = vae.get("block_out_channels") or [vae.get("base_dim", 128)]
    spatial = 2 ** (len(channels) - 1) if "block_out_channels" in vae else 8
    temporal = 4 if video else 1
    den = _config(folder, "transformer") or _config(folder, "unet")
    hidden = (
        den.get("num_attention_heads", 0) * den.get("attention_head_dim", 0)
        or den.get("hidden_size")
        or max(den.get("block_out_channels") or [0])
        or 3072
    )
    tokens = pixels // (spatial * spatial * 4) * ((frames - 1) // temporal + 1) + _TEXT_TOKENS
    transformer = _ACTIVATION_COPIES * rows * tokens * hidden * dtype_bytes
    tiled = sd.acceleration is not None and sd.acceleration.vae_tiling
    vae_pixels = min(pixels, _TILE_PIXELS) if tiled else pixels
    decode = _VAE_COPIES * (rows // 2) * vae_pixels * frames * max(channels) * dtype_bytes
    note = (
        f"activation estimate: {rows // 2} rows x2 CFG, {pixels} px"
        + (f" x {frames} frames" if video else "")
        + f" ({tokens} tokens x {hidden} hidden; VAE {'tiled' if tiled else 'whole'})"
    )
    return max(transformer, decode), note


def stage_table(spec: Any, folder: Path) -> list[tuple[str, str, tuple[int, ...]]]:
    """The folder's tensors; of a multi-stage checkpoint, the stage's own (``thinker.`` for a stage named thinker)."""
    table = list(safetensors_table(folder)) if folder.is_dir() else []
    prefix = f"{spec.name}." if spec.name else None
    if prefix and any(n.startswith(prefix) for n, _, _ in table):
        table = [t for t in table if t[0].startswith(prefix)]
    return table


def _llm_plan(spec: Any, sd: StageDeployConfig, folder: Path, device_memory: int | None) -> StagePlan:
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    pre_quantized = "quantization_config" in config or "quantization_config" in config.get("text_config", {})
    stored = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    dtype = sd.dtype if sd.dtype not in (None, "auto") else ("bfloat16" if stored == "float32" else stored)
    dtype_bytes = _DTYPE_BYTES.get(str(dtype), 2)
    method = sd.quantization if isinstance(sd.quantization, str) else None
    weights = 0
    for name, dt, shape in stage_table(spec, folder):
        numel = _numel(shape)
        if pre_quantized or not _is_float(dt):
            weights += numel * _ST_SIZES.get(dt, 4)
        elif method and _VLLM_ONE_BYTE.search(method) and _is_linear_weight(name, shape) and "embed" not in name:
            weights += numel + shape[0] * 4
        else:
            weights += numel * dtype_bytes
    tp = sd.tp_size * (sd.pipeline_parallel_size or 1)
    per_device = weights // tp
    parts = [(f"{'pre-quantized ' if pre_quantized else ''}{method or dtype} weights / {tp} device(s)", per_device)]
    if sd.kv_cache_memory_bytes is not None:
        budget, includes, note = sd.kv_cache_memory_bytes, False, "kv_cache_memory_bytes (KV cache beside weights)"
    else:
        util = sd.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        budget = int(util * device_memory) if device_memory else per_device
        includes, note = True, f"gpu_memory_utilization {util} of the device (weights, activations, KV cache)"
    return StagePlan(spec.stage_id, spec.kind, _stage_devices(sd), per_device, budget, includes, note, parts)


def plan_memory(
    pipeline: Pipeline,
    deploy: DeployConfig,
    model: str | None,
    device_memory: int | None,
    *,
    max_image_pixels: int | None = None,
    max_num_frames: int | None = None,
    activations: bool = True,
) -> MemoryPlan:
    """``activations=False``: diffusion stages count their weights only."""
    from omnistage.limits import DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_NUM_FRAMES

    limits = {
        "max_image_pixels": max_image_pixels or DEFAULT_MAX_IMAGE_PIXELS,
        "max_num_frames": max_num_frames or DEFAULT_MAX_NUM_FRAMES,
    }
    stages: list[StagePlan] = []
    for spec in pipeline.stages:
        sd = deploy.stage(spec.stage_id) or StageDeployConfig(stage_id=spec.stage_id)
        plan = stage_plan(spec, sd, model, device_memory, limits, activations)
        if plan is not None:
            stages.append(plan)
    return MemoryPlan(stages, device_memory, _problems(stages, device_memory, deploy))


def stage_plan(
    spec: Any,
    sd: StageDeployConfig,
    model: str | None,
    device_memory: int | None,
    limits: dict[str, int],
    activations: bool = True,
) -> StagePlan | None:
    """One stage's plan (None: it names no model folder)."""
    root = sd.model or model
    if root is None:
        return None
    folder = Path(root) / (spec.model_subfolder or "")
    if spec.kind == "diffusion" and (folder / "model_index.json").is_file():
        return _diffusion_plan(spec, sd, folder, limits, activations)
    if spec.kind == "llm" and folder.is_dir():
        return _llm_plan(spec, sd, folder, device_memory)
    # generation stages and custom engines: their weights as stored
    weights = sum(_numel(s) * _ST_SIZES.get(d, 4) for _, d, s in stage_table(spec, folder))
    return StagePlan(spec.stage_id, spec.kind, _stage_devices(sd), weights, 0, False, "weights as stored")


def stage_need(spec: Any, sd: StageDeployConfig, model: str | None, gpu: bool) -> tuple[int, str] | None:
    """The least memory one device of a stage's replica needs, and why (None: no model folder), for placing it
    on a node of known size. The weights, with the budget beside them (``kv_cache_memory_bytes``); a vLLM stage
    on a GPU keeps them within ``gpu_memory_utilization`` of the device. Diffusion activations are not counted
    (the estimate assumes the largest batch at the size caps, which a deploy may never see)."""
    plan = stage_plan(spec, sd, model, None, {"max_image_pixels": 0, "max_num_frames": 0}, activations=False)
    if plan is None:
        return None
    if gpu and plan.budget_includes_weights:
        util = sd.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        return -(
            -plan.weight_bytes * 100 // round(util * 100)
        ), f"{human(plan.weight_bytes)} of weights within {util} of it"
    what = f"{human(plan.weight_bytes)} of weights" + (
        f" + {human(plan.budget_bytes)} ({plan.budget_note})"
        if plan.budget_bytes and not plan.budget_includes_weights
        else ""
    )
    return plan.per_device, what


def _problems(stages: list[StagePlan], device_memory: int | None, deploy: DeployConfig) -> list[str]:
    if not device_memory:
        return []
    out = []
    for s in stages:
        if s.budget_includes_weights and s.weight_bytes > s.budget_bytes:
            out.append(
                f"stage {s.stage_id} ({s.kind}): its weights, {human(s.weight_bytes)} per device, exceed its "
                f"gpu_memory_utilization share ({human(s.budget_bytes)}): quantize it (quantization: fp8), raise "
                "tensor_parallel_size or gpu_memory_utilization"
            )
    totals: dict[str, list[StagePlan]] = {}
    for s in stages:
        for d in s.devices:
            totals.setdefault(d, []).append(s)
    for d, on in sorted(totals.items()):
        total = sum(s.per_device for s in on)
        if total <= device_memory:
            continue
        biggest = max(on, key=lambda s: s.per_device)
        what = _advice(biggest, len(on) > 1)
        names = ", ".join(f"stage {s.stage_id} {human(s.per_device)}" for s in on)
        out.append(
            f"device {d}: {human(total)} needed ({names}) but the device has {human(device_memory)}; "
            f"stage {biggest.stage_id} takes the most: {what}"
        )
    return out


def _advice(s: StagePlan, shared: bool) -> str:
    move = "; or move a stage to another device (devices:)" if shared else ""
    if s.kind == "llm":
        return "lower its gpu_memory_utilization / kv_cache_memory_bytes, or quantize it (quantization: fp8)" + move
    if s.kind == "diffusion":
        big = max(s.parts, key=lambda p: p[1])[0] if s.parts else "transformer"
        return (
            f"quantize its largest component ({big}: quantization with components_to_quantize), lower max_num_seqs "
            "or --max-image-pixels, or turn on acceleration.vae_tiling" + move
        )
    return "give it another device (devices:)" + move
