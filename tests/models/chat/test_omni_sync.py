"""The synchronous Omni entry point on the chat family: a list of prompts in,
outputs identical to vLLM's own LLM.generate (greedy and seeded)."""

from __future__ import annotations

import pytest

from omnistage import Omni

from .chat_cases import ENGINE, GREEDY, PROMPTS, SEEDED


@pytest.mark.vllm
def test_omni_generate_matches_llm_generate(chat_dir, reference):
    from vllm import SamplingParams

    with Omni(str(chat_dir), **ENGINE) as omni:
        assert omni.pipeline.name == "chat"
        greedy = omni.generate(PROMPTS, [dict(GREEDY)], use_tqdm=False)
        seeded = omni.generate(PROMPTS, [SamplingParams(**SEEDED)], use_tqdm=False)  # vLLM's own params object
    assert [o.text for o in greedy] == [text for _, text in reference["greedy"]]
    assert [o.text for o in seeded] == [text for _, text in reference["seeded"]]
    assert all(o.finished and o.error is None and o.finish_reason == "length" for o in greedy + seeded)
