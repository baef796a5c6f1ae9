"""What ``omnistage serve``'s flags ask for: the engine's arguments (CLI > --stage-overrides > deploy YAML >
pipeline defaults), the LoRA stages' overrides, the server's options, and the checks made before any model
loads (the memory plan, the stores)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger("omnistage.serve")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The AsyncOmni(...) arguments the flags ask for."""
    kwargs: dict[str, Any] = {"pipeline": args.pipeline}
    deploy = args.deploy_config or args.stage_configs_path
    if args.distributed_executor_backend:
        # A top-level deploy field: layered over the YAML (if any) through base_config.
        overlay: dict[str, Any] = {"distributed_executor_backend": args.distributed_executor_backend}
        if deploy:
            overlay["base_config"] = str(Path(deploy).resolve())
        deploy = overlay
    kwargs["deploy_config"] = deploy
    if args.stage_overrides:
        try:
            kwargs["stage_overrides"] = json.loads(args.stage_overrides)
        except json.JSONDecodeError as e:
            raise ValueError(f"--stage-overrides is not valid JSON: {e}") from None
    for flag in ("max_num_seqs", "enforce_eager", "trust_remote_code"):
        if getattr(args, flag) is not None:
            kwargs[flag] = getattr(args, flag)
    if args.limit_mm_per_prompt:
        try:
            kwargs["limit_mm_per_prompt"] = json.loads(args.limit_mm_per_prompt)
        except json.JSONDecodeError as e:
            raise ValueError(f"--limit-mm-per-prompt is not valid JSON: {e}") from None
    return kwargs


def with_lora_flags(model: str | None, kwargs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The LoRA flags as stage overrides of the pipeline's LoRA stages (which stages those are needs the
    resolved pipeline: an ``AsyncOmni`` is built for it, nothing starts). The flags win over
    ``--stage-overrides`` for the keys they set."""
    from omnistage import AsyncOmni
    from omnistage.lora import cli_overrides, parse_lora_modules

    modules = parse_lora_modules(args.lora_modules or [])
    enable = bool(args.enable_lora or args.allow_runtime_lora_updating)
    if not (modules or enable or args.max_loras or args.max_lora_rank):
        return kwargs
    pipeline = AsyncOmni(model, **kwargs).pipeline
    extra = cli_overrides(
        pipeline, lora_modules=modules, enable_lora=enable, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank
    )
    overrides = dict(kwargs.get("stage_overrides") or {})
    for sid, fields in extra.items():
        key = next((k for k in overrides if str(k) == str(sid)), str(sid))
        overrides[key] = {**(overrides.get(key) or {}), **fields}
    return {**kwargs, "stage_overrides": overrides}


def serve_options(args: argparse.Namespace) -> Any:
    """The ServeOptions the flags ask for (what the server enforces per request)."""
    from omnistage.server import ServeOptions

    return ServeOptions(
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        max_pending=args.max_pending,
        allowed_local_media_path=args.allowed_local_media_path,
        max_media_bytes=int(args.max_upload_mb * (1 << 20)),
        shutdown_grace_s=args.shutdown_timeout,
        max_download_bytes=int(args.max_download_mb * (1 << 20)),
        media_fetch_timeout_s=args.media_fetch_timeout,
        max_audio_s=args.max_audio_seconds,
        allowed_media_domains=args.allowed_media_domains,
        request_timeout_s=args.request_timeout,
        max_image_pixels=args.max_image_pixels,
        max_num_frames=args.max_num_frames,
        max_inference_steps=args.max_inference_steps,
        max_tokens=args.max_tokens,
        allow_runtime_lora_updating=args.allow_runtime_lora_updating,
        max_realtime_sessions=args.max_realtime_sessions,
        realtime_max_buffer_s=args.realtime_max_audio_seconds,
        realtime_idle_timeout_s=args.realtime_idle_timeout,
        realtime_max_session_s=args.realtime_max_session_seconds,
        duplex_resume_grace_s=args.duplex_resume_grace,
        duplex_frame_budget_ms=args.duplex_frame_budget_ms,
    )


def memory_problems(engine: Any, args: argparse.Namespace) -> list[str]:
    """The memory plan's verdict (memory_plan.py) when the device size is known: weights and vLLM's reservations
    per device. The diffusion activation estimate is only logged (``omnistage plan`` checks it): it assumes the
    largest batch at the size caps, which a deploy may never see."""
    from omnistage.cli.plan import device_memory
    from omnistage.memory_plan import plan_memory

    memory = device_memory(args.device_memory)
    if memory is None:
        return []
    limits = dict(max_image_pixels=args.max_image_pixels, max_num_frames=args.max_num_frames)
    full = plan_memory(engine.pipeline, engine.deploy, engine.model, memory, **limits)
    logging.getLogger("omnistage.cli.serve").info("memory plan:\n%s", full.format())
    return plan_memory(engine.pipeline, engine.deploy, engine.model, memory, activations=False, **limits).problems


def log_parallel_layouts(engine: Any) -> None:
    """The layout each multi-device diffusion replica will run with (ranks, degrees, devices, backend)."""
    from omnistage.stages.diffusion.parallel.layout import replica_lines

    for line in replica_lines(engine.pipeline, engine.deploy):
        logger.info(line)


def unreachable_store(settings: Any) -> str | None:
    """Why the job store or the media store cannot be used, checked before any model loads (None when both
    answer)."""
    import asyncio

    from omnistage.server.fleet import probe_stores
    from omnistage.server.jobs import StoreUnavailable

    try:
        asyncio.run(probe_stores(settings))
    except StoreUnavailable as e:
        return str(e)
    return None
