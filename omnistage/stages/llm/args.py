"""What a vLLM engine of an llm stage is built with: ``AsyncEngineArgs`` keywords and the output type,
both from the stage's deploy config (start-up errors, before any engine exists)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.modality import OutputModality
from omnistage.pipeline import StageContext

PRODUCIBLE = OutputModality.TEXT | OutputModality.TOKEN_IDS
DEFAULT_CPU_KV_CACHE_BYTES = 64 << 20  # without it the CPU backend reserves a share of all RAM


def engine_args_for(ctx: StageContext) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments from the stage's deploy config."""
    from vllm.platforms import current_platform

    d = ctx.deploy
    model = Path(ctx.model) if ctx.model else None
    if model is None:
        raise ValueError(f"stage {ctx.spec.stage_id}: an llm stage needs a model folder")
    if ctx.spec.model_subfolder:
        model = model / ctx.spec.model_subfolder
    args: dict[str, Any] = {"model": str(model), "disable_log_stats": True, "tensor_parallel_size": d.tp_size}
    if current_platform.is_cpu():
        args["enforce_eager"] = True  # compiling costs ~30 s at start-up on CPU and gains little
    optional = {
        "max_num_seqs": d.max_num_seqs,
        "max_model_len": d.max_model_len,
        "max_num_batched_tokens": d.max_num_batched_tokens,
        "enforce_eager": d.enforce_eager,
        "kv_cache_memory_bytes": d.kv_cache_memory_bytes,
        "gpu_memory_utilization": d.gpu_memory_utilization,
        "enable_prefix_caching": d.enable_prefix_caching,
        "trust_remote_code": d.trust_remote_code,
        "dtype": d.dtype,
        "seed": d.seed,
        "limit_mm_per_prompt": d.limit_mm_per_prompt,
        # vLLM's method name; a pre-quantized checkpoint's config.json says its own (the builder refuses a mapping)
        "quantization": d.quantization if isinstance(d.quantization, str) else None,
    }
    args.update({k: v for k, v in optional.items() if v is not None})
    if d.lora_enabled:  # vLLM's own LoRA support; adapters come per request as LoRARequest
        args["enable_lora"] = True
        limits = {"max_loras": d.max_loras, "max_lora_rank": d.max_lora_rank}
        args.update({k: v for k, v in limits.items() if v is not None})
    if current_platform.is_cpu() and d.kv_cache_memory_bytes is None and d.gpu_memory_utilization is None:
        args["kv_cache_memory_bytes"] = DEFAULT_CPU_KV_CACHE_BYTES
    args.update(d.engine_args)  # explicit pass-through wins
    return args


def stage_output_type(ctx: StageContext) -> OutputModality:
    out = OutputModality.parse(ctx.deploy.engine_output_type or ctx.spec.output)
    if out & ~PRODUCIBLE:
        raise ValueError(
            f"stage {ctx.spec.stage_id}: engine_output_type {out} is not something an llm stage "
            f"produces (it produces {PRODUCIBLE})"
        )
    return out
