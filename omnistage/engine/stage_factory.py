"""Build a stage replica's engine from its context, where its deploy config puts it:
in this process (inline), in a child process (mp) or in a Ray actor (ray)."""

from __future__ import annotations

from omnistage.pipeline import StageContext
from omnistage.stages.base import StageEngine
from omnistage.stages.diffusion.parallel.layout import runs_as_group
from omnistage.stages.inline import build_inline_engine


def process_mode(ctx: StageContext) -> str:
    # vLLM runs its own engine-core process; diffusion/generation default to in-process too
    return ctx.deploy.process_mode or "inline"


def build_engine(ctx: StageContext) -> StageEngine:
    mode = process_mode(ctx)
    if runs_as_group(ctx.spec, ctx.deploy):  # one replica over several devices: a process group (inline or mp alike)
        from omnistage.transport.process_group import ProcessGroupStageEngine

        return ProcessGroupStageEngine(ctx)
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
