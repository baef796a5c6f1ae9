"""Build a stage replica's engine from its context: the generic engine of the
stage's kind (or the family's own factory), in-process or in a child process."""

from __future__ import annotations

import importlib

from omnistage.pipeline import StageContext
from omnistage.stages.base import StageEngine

# Generic engines by stage kind, imported lazily so that a diffusion-only
# server never imports vLLM (and vice versa).
_GENERIC = {
    "llm": "omnistage.stages.llm.engine:LLMStageEngine",
    "diffusion": "omnistage.stages.diffusion.engine:DiffusionStageEngine",
    "generation": "omnistage.stages.generation.engine:GenerationStageEngine",
}
# vLLM runs its own engine-core process; diffusion/generation default to in-process.
_DEFAULT_PROCESS = {"llm": "inline", "diffusion": "inline", "generation": "inline"}


def process_mode(ctx: StageContext) -> str:
    return ctx.deploy.process_mode or _DEFAULT_PROCESS[ctx.spec.kind]


def build_inline_engine(ctx: StageContext) -> StageEngine:
    if ctx.spec.engine is not None:
        return ctx.spec.engine(ctx)
    module, _, cls = _GENERIC[ctx.spec.kind].partition(":")
    return getattr(importlib.import_module(module), cls)(ctx)


def build_engine(ctx: StageContext) -> StageEngine:
    mode = process_mode(ctx)
    if mode == "inline":
        return build_inline_engine(ctx)
    if mode == "mp":
        if ctx.spec.kind == "llm" and ctx.spec.engine is None:
            raise ValueError(f"stage {ctx.spec.stage_id}: llm stages run vLLM's own processes; use process: inline")
        from omnistage.transport.process import ProcessStageEngine

        return ProcessStageEngine(ctx)
    if mode == "ray":
        from omnistage.transport.ray_stage import RayStageEngine

        return RayStageEngine(ctx)
    raise ValueError(f"stage {ctx.spec.stage_id}: process mode {mode!r} is not available (use inline, mp or ray)")
