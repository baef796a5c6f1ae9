import pytest

from omnistage.testing.run_cache import shared
from tests.models.offline_llm import offline_llm

from .chat_cases import ENGINE, GREEDY, MESSAGES, PROMPTS, SEEDED


@pytest.fixture(scope="session")
def chat_dir(tiny_model):
    return tiny_model("chat")


@pytest.fixture(scope="session")
def reference(chat_dir):
    """vLLM's own offline ``LLM.generate`` / ``LLM.chat`` on the same folder and engine settings, computed once
    per test run for both xdist workers (omnistage/testing/run_cache.py)."""
    return shared("chat-vllm-reference", lambda: _reference(chat_dir))


def _reference(chat_dir) -> dict:
    from vllm import SamplingParams

    with offline_llm(chat_dir, **ENGINE) as llm:
        ref = {}
        for name, p in (("greedy", GREEDY), ("seeded", SEEDED)):
            outs = llm.generate(PROMPTS, SamplingParams(**p), use_tqdm=False)
            ref[name] = [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]
        chat = llm.chat([MESSAGES], SamplingParams(**GREEDY), use_tqdm=False)[0]
        ref["chat"] = (list(chat.prompt_token_ids), list(chat.outputs[0].token_ids), chat.outputs[0].text)
    return ref
