"""Build a stage replica's engine in this process: the family's own factory, or
the generic engine of the stage's kind. Each generic engine is imported only
when a stage of its kind starts (a diffusion-only server never imports vLLM)."""

from __future__ import annotations

from omnistage.pipeline import StageContext
from omnistage.stages.base import StageEngine


def build_inline_engine(ctx: StageContext) -> StageEngine:
    if ctx.spec.engine is not None:
        return ctx.spec.engine(ctx)
    if ctx.spec.kind == "llm":
        from omnistage.stages.llm.engine import LLMStageEngine

        return LLMStageEngine(ctx)
    if ctx.spec.kind == "diffusion":
        from omnistage.stages.diffusion.engine import DiffusionStageEngine

        return DiffusionStageEngine(ctx)
    from omnistage.stages.generation.engine import GenerationStageEngine

    return GenerationStageEngine(ctx)
