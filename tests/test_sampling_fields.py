"""vLLM SamplingParams names given to a stage that does not read them: dropped with a warning, where a name that
is no field at all still reaches the stage's own check (a 400 naming it)."""

from __future__ import annotations

import pytest

from omnistage.errors import InvalidRequestError
from omnistage.llm_params import LLMSamplingParams
from omnistage.models.qwen2_5_omni import QWEN2_5_OMNI
from omnistage.models.qwen_omni import QWEN_OMNI
from omnistage.params import stage_params
from omnistage.sampling_fields import VLLM_SAMPLING_FIELDS

# vLLM-Omni's example clients' per-stage lists (thinker, talker, code2wav / token2wav), as they send them
QWEN3_LIST = [
    {"temperature": 0.4, "top_p": 0.9, "top_k": 1, "max_tokens": 16384, "repetition_penalty": 1.05, "seed": 42},
    {
        "temperature": 0.9,
        "top_k": 50,
        "max_tokens": 4096,
        "seed": 42,
        "detokenize": False,
        "repetition_penalty": 1.05,
        "stop_token_ids": [2150],
    },
    {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 65536,
        "seed": 42,
        "detokenize": True,
        "repetition_penalty": 1.1,
    },
]


def test_the_fixed_list_is_vllms():
    from vllm import SamplingParams

    assert VLLM_SAMPLING_FIELDS == {k for k in SamplingParams.__struct_fields__ if not k.startswith("_")}


def test_an_llm_stage_takes_every_field_a_request_may_set():
    """LLMSamplingParams: vLLM's public fields but the two the stage sets itself, and the LoRA the request names."""
    own = {"lora", "lora_scale"}
    assert set(LLMSamplingParams.__struct_fields__) == (VLLM_SAMPLING_FIELDS - {"output_kind", "skip_clone"}) | own


@pytest.mark.parametrize("pipeline", [QWEN_OMNI, QWEN2_5_OMNI], ids=lambda p: p.name)
def test_a_stage_keeps_what_it_reads_and_says_what_it_ignores(pipeline):
    warnings: list[str] = []
    params = stage_params(pipeline, [{}, {}, {}], None, QWEN3_LIST, None, warnings)
    assert params[0].given() == QWEN3_LIST[0]  # the llm stage takes every vLLM field (vLLM checks them)
    assert params[1] == {k: v for k, v in QWEN3_LIST[1].items() if k not in ("detokenize", "stop_token_ids")}
    assert params[2] == {"seed": 42}
    assert warnings == [
        "sampling_params_list[1]: detokenize, stop_token_ids ignored: the talker stage does not use them "
        "(it reads max_tokens, repetition_penalty, seed, speaker, temperature, top_k, top_p)",
        f"sampling_params_list[2]: detokenize, max_tokens, repetition_penalty, temperature, top_k, top_p ignored: "
        f"the {pipeline.stages[2].name} stage does not use them (it reads "
        f"{', '.join(sorted(pipeline.stages[2].param_keys))})",
    ]


def test_offline_the_warning_is_logged(caplog):
    with caplog.at_level("WARNING", logger="omnistage.params"):
        params = stage_params(QWEN_OMNI, [{}, {}, {}], None, [None, None, {"detokenize": True}])
    assert params[2] == {}
    assert "sampling_params_list[2]: detokenize ignored: the code2wav stage does not use it" in caplog.text


def test_a_name_that_is_no_field_reaches_the_stages_check():
    from omnistage.models.qwen_omni.config import TALKER_DEFAULTS
    from omnistage.models.shared.omni.sampling import talker_sampling

    params = stage_params(QWEN_OMNI, [{}, {}, {}], None, [None, {"temprature": 0.5}], None, [])
    assert params[1] == {"temprature": 0.5}
    with pytest.raises(InvalidRequestError, match="temprature"):  # the stage's own check names it
        talker_sampling(params[1], TALKER_DEFAULTS)
