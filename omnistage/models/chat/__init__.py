"""``chat``: any causal LM vLLM supports, served as a one-stage text pipeline.

Outputs are the same as vLLM's own ``LLM.generate`` for the same prompt and
sampling parameters (greedy and seeded). A transformers folder is matched by
its ``config.json`` ``architectures`` when vLLM has a generative model for it;
diffusers folders (``model_index.json``) and folders naming their pipeline in
``omnistage.json`` are never claimed here.
"""

from __future__ import annotations

from omnistage.pipeline import ModelFolder, Pipeline, StageSpec, register_pipeline

_GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
# Architectures omnistage itself registers with vLLM for other families' stages: they draw
# image tokens, not chat text, so a folder holding one alone is not a chat model.
_NOT_CHAT = {"GlmImageForConditionalGeneration"}


def vllm_generates(architectures: list[str]) -> bool:
    """True when vLLM has a text-generating model for one of the architectures.

    Imports vLLM's registry (not the engine) only after the cheap checks pass.
    """
    candidates = [a for a in architectures if a.endswith(_GENERATIVE_SUFFIXES) and a not in _NOT_CHAT]
    if not candidates:
        return False
    try:
        from vllm.model_executor.models.registry import ModelRegistry
    except ImportError:
        return False
    supported = ModelRegistry.get_supported_archs()
    return any(a in supported for a in candidates)


def matches(folder: ModelFolder) -> bool:
    if folder.diffusers_class is not None or folder.omnistage_pipeline is not None:
        return False
    return vllm_generates(folder.architectures)


CHAT = register_pipeline(Pipeline(
    name="chat",
    description="a vLLM causal LM as one text stage",
    matches=matches,
    stages=[StageSpec(0, kind="llm", name="llm", output="text", can_output="text+token_ids", final=True)],
))
