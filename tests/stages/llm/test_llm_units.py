"""llm stage pieces that need no running engine: request validation,
the shapes of prompts/messages/media, thread settings, chat-family matching."""

from __future__ import annotations

import json

import pytest

from omnistage.llm_params import LLMSamplingParams
from omnistage.pipeline import ModelFolder
from omnistage.stages.llm.threads import cpu_thread_env

VOCAB = 384


def test_typed_params_become_delta_sampling_params():
    from vllm.sampling_params import RequestOutputKind

    from omnistage.stages.llm.params import to_sampling_params

    params = LLMSamplingParams.from_any({"temperature": 0.5, "max_tokens": 7, "seed": 3, "stop_token_ids": [2]})
    sp = to_sampling_params(params, vocab_size=VOCAB)
    assert (sp.temperature, sp.max_tokens, sp.seed, sp.stop_token_ids) == (0.5, 7, 3, [2])
    assert sp.output_kind == RequestOutputKind.DELTA
    # only the fields that were set reach vLLM: the rest are vLLM's defaults, but max_tokens (to the context's end)
    plain = to_sampling_params(LLMSamplingParams(), vocab_size=VOCAB)
    assert (plain.temperature, plain.top_p, plain.top_k, plain.max_tokens) == (1.0, 1.0, 0, None)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"stop_token_ids": [VOCAB]}, rf"^stop_token_ids: {VOCAB} is outside the vocabulary \(0..{VOCAB - 1}\)"),
        ({"min_tokens": 5, "max_tokens": 2}, r"^sampling_params: .*min_tokens"),  # vLLM's own check, re-raised
    ],
)
def test_what_needs_the_model_or_vllm_is_checked_in_the_stage(params, message):
    """(Types, ranges and field names were checked at admission: tests/test_params.py.)"""
    from omnistage.stages.llm.params import to_sampling_params

    with pytest.raises(ValueError, match=message):
        to_sampling_params(LLMSamplingParams.from_any(params), vocab_size=VOCAB)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"max_tokens": 0}, r"^max_tokens: Input should be greater than or equal to 1"),
        ({"max_tokens": 2.5}, r"^max_tokens: expected an integer"),
        ({"temperature": -1}, r"^temperature: Input should be greater than or equal to 0"),
        ({"temperature": "hot"}, r"^temperature: expected a number"),
        ({"stop_token_ids": 5}, r"^stop_token_ids: expected a list"),
        ({"seed": "x"}, r"^seed: expected an integer"),
        ({"bogus": 1, "other": 2}, r"^sampling_params: unknown field\(s\) bogus, other"),
    ],
)
def test_a_dict_from_another_caller_is_checked_as_at_admission(params, message):
    """A direct engine call (or params that crossed a process) arrives as a dict: typed with the same checks."""
    from omnistage.stages.llm.params import llm_params

    with pytest.raises(ValueError, match=message):
        llm_params(params)


def test_sampling_params_object_is_checked_and_copied():
    from vllm import SamplingParams

    from omnistage.stages.llm.params import llm_params, to_sampling_params

    mine = SamplingParams(max_tokens=4, stop_token_ids=[VOCAB + 3])
    with pytest.raises(ValueError, match="stop_token_ids"):
        to_sampling_params(mine, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="^n: an llm stage streams one completion"):
        to_sampling_params(SamplingParams(n=2), vocab_size=VOCAB)
    ok = SamplingParams(max_tokens=4)
    assert llm_params(ok) is ok
    assert to_sampling_params(ok, vocab_size=VOCAB) is not ok


def test_inputs_parse_into_what_vllm_renders():
    """Shapes only: templating and tokenization are vLLM's renderer's (checked against LLM.chat in
    tests/models/chat and tests/stages/llm/test_multimodal_vllm.py)."""
    from omnistage.stages.llm.inputs import parse

    p = parse({"prompt": "hello world"})
    assert (p.field, p.text, p.token_ids, p.needs_renderer) == ("prompt", "hello world", None, True)
    p = parse({"prompt_token_ids": [5, 6], "prompt": "x"})
    assert (p.token_ids, p.text, p.needs_renderer) == ([5, 6], "x", False)
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:,"}}],
        },
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [
                {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                {"type": "video_url", "video_url": {"url": "data:,"}},
            ],
        },
    ]
    p = parse({"messages": msgs, "chat_template_kwargs": {"continue_final_message": True}})
    assert p.field == "messages" and p.messages is msgs
    assert p.media == [
        ("messages[0].content[1].image_url", "image"),
        ("messages[2].content[0].input_audio", "audio"),
        ("messages[2].content[1].video_url", "video"),
    ]
    assert p.chat_template_kwargs == {"continue_final_message": True, "add_generation_prompt": False}


def test_multi_modal_data_items_are_normalised():
    """Audio pairs that a transport turned into lists become (array, rate) tuples again; every modality a list."""
    import numpy as np

    from omnistage.stages.llm.inputs import parse

    wave = np.zeros(8, np.float32)
    p = parse({"prompt": "x", "multi_modal_data": {"audio": [wave, 16000], "image": "img"}})
    assert p.multi_modal_data["image"] == ["img"]
    (clip,) = p.multi_modal_data["audio"]
    assert isinstance(clip, tuple) and clip[0] is wave and clip[1] == 16000
    p = parse({"prompt": "x", "multi_modal_data": {"audio": [[wave, 8000], (wave, 16000)]}})
    assert [c[1] for c in p.multi_modal_data["audio"]] == [8000, 16000]
    assert p.media == [("multi_modal_data.audio[0]", "audio"), ("multi_modal_data.audio[1]", "audio")]


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"prompt": 3}, r"^prompt: needs"),
        ({"prompt_token_ids": ["a"]}, r"^prompt_token_ids: expected a list of integers"),
        ({"messages": "hi"}, r"^messages: expected a non-empty list"),
        ({"messages": [{"content": "no role"}]}, r"^messages\[0\]: expected an object with 'role'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "smell"}]}]},
            r"^messages\[0\]\.content\[0\]\.type: unsupported content part type 'smell'",
        ),
        ({"messages": [{"role": "user", "content": 5}]}, r"^messages\[0\]\.content: expected a string or a list"),
        (
            {"messages": [{"role": "user", "content": "x"}], "multi_modal_data": {"image": [1]}},
            r"^multi_modal_data: with 'messages' the media go in the messages' content parts",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "chat_template_kwargs": {"continue_final_message": True, "add_generation_prompt": True},
            },
            r"^continue_final_message: cannot be combined",
        ),
        ({"prompt": "x", "multi_modal_data": [1]}, r"^multi_modal_data: expected an object"),
        ({"prompt": "x", "mm_processor_kwargs": 3}, r"^mm_processor_kwargs: expected an object"),
        ({"prompt": "x", "image": 1}, r"^prompt: unsupported key\(s\) for an llm stage: image"),
    ],
)
def test_bad_inputs(inputs, message):
    from omnistage.stages.llm.inputs import parse

    with pytest.raises(ValueError, match=message):
        parse(inputs)


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
    assert not matches(
        _folder(tmp_path, "glm", {"config.json": {"architectures": ["GlmImageForConditionalGeneration"]}})
    )
    assert not matches(_folder(tmp_path, "bert", {"config.json": {"architectures": ["BertModel"]}}))
    assert not matches(
        _folder(
            tmp_path,
            "diffusers",
            {
                "model_index.json": {"_class_name": "GlmImagePipeline"},
                "config.json": {"architectures": ["Qwen2ForCausalLM"]},
            },
        )
    )
    assert not matches(
        _folder(
            tmp_path,
            "named",
            {"omnistage.json": {"pipeline": "prompt_expand"}, "config.json": {"architectures": ["Qwen2ForCausalLM"]}},
        )
    )


def test_unproducible_output_type_is_refused_before_any_engine():
    from omnistage.config.schema import StageDeployConfig
    from omnistage.models.chat import CHAT
    from omnistage.pipeline import StageContext
    from omnistage.stages.llm.engine import LLMStageEngine

    ctx = StageContext(
        spec=CHAT.stages[0], deploy=StageDeployConfig(stage_id=0, engine_output_type="text+audio"), model="x"
    )
    with pytest.raises(ValueError, match="engine_output_type text\\+audio"):
        LLMStageEngine(ctx)
