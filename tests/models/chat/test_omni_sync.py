"""The synchronous Omni entry point on the chat family: a list of prompts in,
outputs identical to vLLM's own LLM.generate (greedy and seeded), also with video in."""

from __future__ import annotations

import pytest

from omnistage import Omni

from . import mm_cases
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


@pytest.mark.vllm
def test_omni_video_matches_llm_chat_and_generate(tiny_model):
    """The synchronous entry point: a video chat and decoded frames in one ``generate`` call."""
    folder = tiny_model("qwen2_5_vl")
    ref = mm_cases.vllm_answers(str(folder), "qwen2_5_vl")
    with Omni(str(folder), limit_mm_per_prompt=mm_cases.VL_LIMITS, **mm_cases.ENGINE) as omni:
        outs = omni.generate(
            [mm_cases.VL_CASES["one_video"].omni_prompt(), mm_cases.VL_RAW["raw_frames"]],
            [dict(mm_cases.GREEDY)],
            use_tqdm=False,
        )
    assert [o.text for o in outs] == [ref["one_video"].text, ref["raw_frames"].text]
    assert all(o.finished and o.error is None for o in outs)
