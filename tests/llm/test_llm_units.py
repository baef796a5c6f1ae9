"""llm stage pieces that need no running engine: request validation,
tokenization of prompts/messages, thread settings, chat-family matching."""

from __future__ import annotations

import json

import pytest

from omnistage.pipeline import ModelFolder
from omnistage.stages.llm.threads import cpu_thread_env

VOCAB = 384


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model("chat"))


def test_dict_params_become_delta_sampling_params():
    from vllm.sampling_params import RequestOutputKind

    from omnistage.stages.llm.params import to_sampling_params

    sp = to_sampling_params({"temperature": 0.5, "max_tokens": 7, "seed": 3, "stop_token_ids": [2]}, vocab_size=VOCAB)
    assert (sp.temperature, sp.max_tokens, sp.seed, sp.stop_token_ids) == (0.5, 7, 3, [2])
    assert sp.output_kind == RequestOutputKind.DELTA


@pytest.mark.parametrize("params, message", [
    ({"max_tokens": 0}, r"^max_tokens: must be >= 1, got 0"),
    ({"max_tokens": 2.5}, r"^max_tokens: expected an integer"),
    ({"temperature": -1}, r"^temperature: must be >= 0"),
    ({"temperature": "hot"}, r"^temperature: expected a number"),
    ({"stop_token_ids": [VOCAB]}, rf"^stop_token_ids: {VOCAB} is outside the vocabulary \(0..{VOCAB - 1}\)"),
    ({"stop_token_ids": 5}, r"^stop_token_ids: expected a list"),
    ({"seed": "x"}, r"^seed: expected an integer"),
    ({"top_p": 0}, r"^sampling_params: .*top_p"),  # vLLM's own check, re-raised naming the field
    ({"bogus": 1, "other": 2}, r"^sampling_params: unknown field\(s\) bogus, other"),
])
def test_bad_params(params, message):
    from omnistage.stages.llm.params import to_sampling_params

    with pytest.raises(ValueError, match=message):
        to_sampling_params(params, vocab_size=VOCAB)


def test_sampling_params_object_is_checked_and_copied():
    from vllm import SamplingParams

    from omnistage.stages.llm.params import to_sampling_params

    mine = SamplingParams(max_tokens=4, stop_token_ids=[VOCAB + 3])
    with pytest.raises(ValueError, match="stop_token_ids"):
        to_sampling_params(mine, vocab_size=VOCAB)
    ok = SamplingParams(max_tokens=4)
    assert to_sampling_params(ok, vocab_size=VOCAB) is not ok


def test_prompt_and_messages_tokenize_like_vllm(tokenizer):
    from omnistage.stages.llm.inputs import prompt_token_ids

    assert prompt_token_ids({"prompt": "hello world"}, tokenizer) == (tokenizer.encode("hello world"), "hello world")
    assert prompt_token_ids({"prompt_token_ids": [5, 6]}, tokenizer)[0] == [5, 6]
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]
    ids, text = prompt_token_ids({"messages": msgs}, tokenizer)
    assert text == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    assert ids == tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("inputs, message", [
    ({"prompt": 3}, r"^prompt: needs"),
    ({"prompt_token_ids": ["a"]}, r"^prompt_token_ids: expected a list of integers"),
    ({"messages": "hi"}, r"^messages: expected a non-empty list"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, r"^messages\[0\]\.content: only text"),
    ({"prompt": "x", "image": 1}, r"^prompt: unsupported key\(s\) for an llm stage: image"),
])
def test_bad_inputs(tokenizer, inputs, message):
    from omnistage.stages.llm.inputs import prompt_token_ids

    with pytest.raises(ValueError, match=message):
        prompt_token_ids(inputs, tokenizer)


def test_thread_env_binds_devices_per_tp_rank(monkeypatch):
    for k in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.delenv(k, raising=False)
    env = cpu_thread_env(["0", "1", "2", "3"], None, tp_size=2)
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0,1|2,3", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "OMP_NUM_THREADS": "2"}
    assert cpu_thread_env(None, 3, 1) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "3"}
    with pytest.raises(ValueError, match="devices"):
        cpu_thread_env(["0", "1", "2"], None, tp_size=2)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # what the user exported wins
    assert "OMP_NUM_THREADS" not in cpu_thread_env(None, 3, 1)


def _folder(tmp_path, name, files):
    d = tmp_path / name
    d.mkdir()
    for fname, content in files.items():
        (d / fname).write_text(json.dumps(content))
    return ModelFolder(d)


def test_chat_matches_only_vllm_causal_lms(tmp_path, tiny_model):
    from omnistage.models.chat import matches

    assert matches(ModelFolder(tiny_model("chat")))
    assert not matches(_folder(tmp_path, "glm", {"config.json": {"architectures": ["GlmImageForConditionalGeneration"]}}))
    assert not matches(_folder(tmp_path, "bert", {"config.json": {"architectures": ["BertModel"]}}))
    assert not matches(_folder(tmp_path, "diffusers", {"model_index.json": {"_class_name": "GlmImagePipeline"},
                                                       "config.json": {"architectures": ["Qwen2ForCausalLM"]}}))
    assert not matches(_folder(tmp_path, "named", {"omnistage.json": {"pipeline": "prompt_expand"},
                                                   "config.json": {"architectures": ["Qwen2ForCausalLM"]}}))


def test_unproducible_output_type_is_refused_before_any_engine():
    from omnistage.config.schema import StageDeployConfig
    from omnistage.models.chat import CHAT
    from omnistage.pipeline import StageContext
    from omnistage.stages.llm.engine import LLMStageEngine

    ctx = StageContext(spec=CHAT.stages[0], deploy=StageDeployConfig(stage_id=0, engine_output_type="text+audio"), model="x")
    with pytest.raises(ValueError, match="engine_output_type text\\+audio"):
        LLMStageEngine(ctx)
