"""LoRA adapters on the chat family over HTTP: ``model`` naming a PEFT adapter (``--lora-modules`` at start,
or ``/v1/load_lora_adapter`` at runtime) gives vLLM's own ``LLM.chat(..., lora_request=...)`` answer; an
unloaded adapter is a 404 naming the model."""

from __future__ import annotations

import os

import openai
import pytest

from omnistage import AsyncOmni
from omnistage.testing.server import serve_engine
from tests.models.chat.chat_cases import ENGINE, GREEDY, MESSAGES
from tests.models.chat.lora_cases import LORA, vllm_reference
from tests.models.chat.lora_cases import adapters as make_adapters

pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="module")
def setup(tiny_model, tmp_path_factory):
    chat_dir = tiny_model("chat")
    paths = make_adapters(tiny_model("chat_lora"), tmp_path_factory.mktemp("chat-loras"))
    return chat_dir, paths, vllm_reference(chat_dir, paths)


def test_model_selects_the_adapter(setup):
    chat_dir, paths, reference = setup
    engine = AsyncOmni(chat_dir, stage_overrides={"0": {"lora_modules": [f"a={paths['a']}"], **LORA}}, **ENGINE)
    with (
        serve_engine(engine, served_model_name="tiny-chat", allow_runtime_lora_updating=True, ready_timeout=300) as srv,
        srv.client() as http,
    ):
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
        models = {m.id: m for m in client.models.list().data}
        assert set(models) == {"tiny-chat", "a"} and models["a"].parent == "tiny-chat"
        r = http.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": paths["b"]})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'b' added successfully.")
        for name, model in ((None, "tiny-chat"), ("a", "a"), ("b", "b")):
            c = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY)
            assert c.choices[0].message.content == reference[("chat", name)], model
        assert reference[("chat", "a")] != reference[("chat", None)]
        r = http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": paths["wide"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"
        assert "max_lora_rank" in r.json()["error"]["message"]
        r = http.post("/v1/unload_lora_adapter", json={"lora_name": "b"})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'b' removed successfully.")
        with pytest.raises(openai.NotFoundError) as e:
            client.chat.completions.create(model="b", messages=MESSAGES, max_tokens=2)
        assert e.value.body["param"] == "model" and "'b'" in e.value.body["message"]
        with pytest.raises(openai.BadRequestError) as e:  # vLLM applies adapters at their trained scale
            client.chat.completions.create(model="a", messages=MESSAGES, max_tokens=2, extra_body={"lora_scale": 0.5})
        assert e.value.body["param"] == "lora_scale"
