import gc
import os

import pytest

from .chat_cases import ENGINE, GREEDY, MESSAGES, PROMPTS, SEEDED


@pytest.fixture(scope="session")
def chat_dir(tiny_model):
    return tiny_model("chat")


@pytest.fixture(scope="session")
def reference(chat_dir):
    """vLLM's own offline ``LLM.generate`` / ``LLM.chat`` on the same folder and engine settings."""
    from vllm import LLM, SamplingParams

    # In-process engine: keep it from binding this test process's threads.
    saved = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    try:
        llm = LLM(str(chat_dir), kv_cache_memory_bytes=64 << 20, **ENGINE)
    finally:
        if saved is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND")
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = saved
    try:
        ref = {}
        for name, p in (("greedy", GREEDY), ("seeded", SEEDED)):
            outs = llm.generate(PROMPTS, SamplingParams(**p), use_tqdm=False)
            ref[name] = [(list(o.outputs[0].token_ids), o.outputs[0].text) for o in outs]
        chat = llm.chat([MESSAGES], SamplingParams(**GREEDY), use_tqdm=False)[0]
        ref["chat"] = (list(chat.prompt_token_ids), list(chat.outputs[0].token_ids), chat.outputs[0].text)
        return ref
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
