"""``chat``: any generative model vLLM supports, served as a one-stage text pipeline.

Text LMs and multimodal ones alike (images / audio / video in, text out, e.g.
Qwen2.5-VL, Qwen2-Audio, Idefics3, LLaVA): prompts, chat messages and media go
through vLLM's own renderer (stages/llm/inputs.py), so outputs are the same as
vLLM's ``LLM.generate`` / ``LLM.chat`` for the same input and sampling
parameters (greedy and seeded). A transformers folder is matched by its
``config.json`` ``architectures`` when vLLM has a generative model for it;
diffusers folders (``model_index.json``) and folders naming their pipeline in
``omnistage.json`` are never claimed here.

An audio-in chat model that can transcribe (Qwen2-Audio) also serves ``/v1/audio/transcriptions`` and
``/translations``: a recogniser request becomes one chat turn — the audio, then "Transcribe this audio into
English." — through the hook the omni families use too (omnistage/models/shared/transcription_chat.py), greedy; other
requests pass the hook untouched.

Tiny fixtures: ``chat`` (Qwen2 text LM), ``vlm`` (Idefics3, images), ``audio_lm`` (Qwen2-Audio),
``qwen2_5_vl`` / ``qwen3_vl`` / ``qwen3_5`` (Qwen2.5-VL / Qwen3-VL / Qwen3.5, images and video), ``chat_lora`` (a PEFT
adapter for ``chat``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from omnistage.info import PipelineInfo
from omnistage.models.chat import tiny, tiny_audio, tiny_lora, tiny_qwen3_5, tiny_qwen_vl, tiny_vlm
from omnistage.models.shared.transcription_chat import TRANSCRIPTION_INFO, to_transcription_chat
from omnistage.pipeline import ModelFolder, Pipeline, StageSpec, read_json

_GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
# Architectures omnistage itself registers with vLLM for other families' stages: they draw
# image tokens, not chat text, so a folder holding one alone is not a chat model.
_NOT_CHAT = {"GlmImageForConditionalGeneration"}
# audio-in chat models that transcribe when asked in a chat turn -> the languages their model cards list
RECOGNISERS = {"Qwen2AudioForConditionalGeneration": ["en", "zh", "yue", "fr", "it", "es", "de", "ja"]}


def vllm_generates(architectures: list[str]) -> bool:
    """True when vLLM has a text-generating model for one of the architectures.

    Imports vLLM's registry (not the engine) only after the cheap checks pass.
    """
    candidates = [a for a in architectures if a.endswith(_GENERATIVE_SUFFIXES) and a not in _NOT_CHAT]
    if not candidates:
        return False
    try:
        from vllm import ModelRegistry
    except ImportError:
        return False
    supported = ModelRegistry.get_supported_archs()
    return any(a in supported for a in candidates)


def matches(folder: ModelFolder) -> bool:
    if folder.diffusers_class is not None or folder.omnistage_pipeline is not None:
        return False
    return vllm_generates(folder.architectures)


def folder_info(folder: Path, info: PipelineInfo) -> PipelineInfo:
    """A recogniser's ``transcription`` info (what the transcription routes read); nothing for other models."""
    architectures = read_json(folder / "config.json").get("architectures") or []
    languages = next((RECOGNISERS[a] for a in architectures if a in RECOGNISERS), None)
    return replace(info, transcription=replace(TRANSCRIPTION_INFO, languages=languages)) if languages else info


CHAT = Pipeline(
    name="chat",
    description="a vLLM generative model (text, or images/audio/video in) as one text stage",
    matches=matches,
    stages=[StageSpec(0, kind="llm", name="llm", output="text", can_output="text+token_ids", final=True)],
    shape_request=to_transcription_chat,  # (only recogniser requests, which only a RECOGNISERS folder is sent)
    folder_info=folder_info,
)
PIPELINES = [CHAT]
TINY = {
    "chat": tiny.build,
    "vlm": tiny_vlm.build,
    "audio_lm": tiny_audio.build,
    "chat_lora": tiny_lora.build,
    "qwen2_5_vl": tiny_qwen_vl.build_qwen2_5_vl,
    "qwen3_vl": tiny_qwen_vl.build_qwen3_vl,
    "qwen3_5": tiny_qwen3_5.build_qwen3_5,
}
