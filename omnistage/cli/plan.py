"""``omnistage plan MODEL``: whether a deploy fits its devices, before anything loads (memory_plan.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from omnistage.cli.args import positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="weight and memory budget per stage and device; non-zero exit when it does not fit")
    p.add_argument("model", help="local model folder")
    p.add_argument("--deploy-config", metavar="FILE", help="deploy YAML")
    p.add_argument("--stage-overrides", metavar="JSON", help='per-stage fields, e.g. \'{"0": {"max_num_seqs": 4}}\'')
    p.add_argument("--pipeline", help="force a registered pipeline (see `omnistage pipelines`)")
    p.add_argument("--device-memory", metavar="SIZE", help="memory of each device, e.g. 80GiB (default: the GPU's)")
    p.add_argument("--max-image-pixels", type=positive_int, help="the server's cap (default: serve's)")
    p.add_argument("--max-num-frames", type=positive_int, help="the server's cap (default: serve's)")


def device_memory(text: str | None) -> int | None:
    """``--device-memory``, else the first GPU's total memory, else None (nothing to check against)."""
    from omnistage.memory_plan import parse_bytes

    if text:
        return parse_bytes(text)
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
    except ImportError:  # pragma: no cover
        pass
    return None


def run(args: argparse.Namespace) -> int:
    from omnistage import AsyncOmni
    from omnistage.memory_plan import plan_memory

    try:
        overrides: Any = json.loads(args.stage_overrides) if args.stage_overrides else None
        memory = device_memory(args.device_memory)
        engine = AsyncOmni(
            args.model, pipeline=args.pipeline, deploy_config=args.deploy_config, stage_overrides=overrides
        )
    except (ValueError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plan = plan_memory(
        engine.pipeline,
        engine.deploy,
        engine.model,
        memory,
        max_image_pixels=args.max_image_pixels,
        max_num_frames=args.max_num_frames,
    )
    print(f"{engine.pipeline.name}: {engine.model}")
    print(plan.format())
    return 0 if plan.fits else 1
