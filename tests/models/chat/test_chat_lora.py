"""PEFT LoRA adapters on the chat family through vLLM's own LoRA support: outputs equal
``vllm.LLM.generate(..., lora_request=LoRARequest(...))`` with ``lora`` in the prompt dict, for requests using
different adapters and none in flight together; runtime load / unload on the stage and the errors that name
their field. (Over HTTP: tests/models/chat/test_lora_http.py.)

One engine of each kind for the module: vLLM engines take tens of seconds to start here.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.testing.streams import all_outputs

from .chat_cases import ENGINE, GREEDY, PROMPTS
from .lora_cases import LORA, vllm_reference
from .lora_cases import adapters as make_adapters

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory):
    return make_adapters(tiny_model("chat_lora"), tmp_path_factory.mktemp("chat-loras"))


@pytest.fixture(scope="module")
def reference(chat_dir, adapters):
    return vllm_reference(chat_dir, adapters)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(chat_dir, adapters, reference):
    engine = AsyncOmni(chat_dir, stage_overrides={"0": {"lora_modules": [f"a={adapters['a']}"], **LORA}}, **ENGINE)
    await engine.start()
    yield engine
    await engine.shutdown()


async def text(omni, prompt, lora=None, **params):
    p = {"prompt": prompt, **({"lora": lora} if lora else {})}
    outs = await all_outputs(omni.generate(p, sampling_params_list=[{**GREEDY, **params}]))
    return outs[-1].text


async def test_adapter_outputs_equal_llm_generate(omni, reference, adapters):
    assert reference["a"] != reference[None]  # the adapter changes the text
    stage = omni.replicas(0)[0]
    await stage.load_lora("b", adapters["b"])
    try:
        jobs = [(p, name) for name in (None, "a", "b") for p in PROMPTS]  # all in flight together
        got = await asyncio.gather(*(text(omni, p, name) for p, name in jobs))
    finally:
        await stage.unload_lora("b")
    for (p, name), t in zip(jobs, got):
        assert t == reference[name][PROMPTS.index(p)], (p, name)


async def test_request_errors_name_their_field(omni):
    with pytest.raises(InvalidRequestError) as e:
        await text(omni, "hello", lora="nope")
    assert e.value.field == "model"
    with pytest.raises(InvalidRequestError) as e:
        await text(omni, "hello", lora="a", lora_scale=0.5)
    assert e.value.field == "lora_scale"


async def test_bad_adapters_name_lora_path(omni, adapters, tiny_model, tmp_path):
    stage = omni.replicas(0)[0]
    cases = [
        (str(tmp_path / "missing"), "does not exist"),
        (adapters["wide"], "rank 16 is greater than max_lora_rank 8"),
        (str(tiny_model("sd3_lora")), "No adapter found"),
    ]  # a diffusers LoRA, not a PEFT adapter
    for path, message in cases:
        with pytest.raises(InvalidRequestError, match=message) as e:
            await stage.load_lora("x", path)
        assert e.value.field == "lora_path"
    assert stage.lora_names() == ["a"] and stage.stats().healthy
