"""Adapters and vLLM's own outputs with them, shared by the chat LoRA tests (offline and over HTTP)."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.chat.tiny_lora import build as build_lora
from omnistage.testing.run_cache import shared
from tests.models.offline_llm import offline_llm

from .chat_cases import ENGINE, GREEDY, MESSAGES, PROMPTS

# vLLM 0.32's CPU LoRA ops read a base row's "no adapter" index -1 as the last slot: with every slot taken,
# base rows get that adapter's delta (vllm-project/vllm#48421, #49656). One slot more than the adapters
# used here keeps the last one empty (GPU kernels skip -1 and are not affected).
LORA = dict(max_loras=3, max_lora_rank=8)


def adapters(chat_lora: Path, root: Path) -> dict[str, str]:
    """``a``: the ``chat_lora`` fixture; ``b``: another seed; ``wide``: rank 16 (above max_lora_rank)."""
    build_lora(root / "b", seed=1)
    build_lora(root / "wide", seed=2, rank=16)
    return {"a": str(chat_lora), "b": str(root / "b"), "wide": str(root / "wide")}


def vllm_reference(chat_dir: Path, paths: dict[str, str]) -> dict:
    """vLLM's ``LLM.generate`` per prompt and ``LLM.chat`` on MESSAGES, greedy: base (None), adapter a, b;
    chat outputs under ``("chat", name)``. Computed once per test run, for both xdist workers (the adapters are
    seeded: each worker's copies hold the same bytes; omnistage/testing/run_cache.py)."""
    return shared("chat-lora-vllm-reference", lambda: _vllm_reference(chat_dir, paths))


def _vllm_reference(chat_dir: Path, paths: dict[str, str]) -> dict:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    with offline_llm(chat_dir, enable_lora=True, **LORA, **ENGINE) as llm:
        out: dict = {}
        for i, name in enumerate((None, "a", "b")):
            lora = LoRARequest(name, i, paths[name]) if name else None
            res = llm.generate(PROMPTS, SamplingParams(**GREEDY), lora_request=lora, use_tqdm=False)
            out[name] = [o.outputs[0].text for o in res]
            chat = llm.chat([MESSAGES], SamplingParams(**GREEDY), lora_request=lora, use_tqdm=False)[0]
            out[("chat", name)] = chat.outputs[0].text
    return out
