"""vLLM's ``quantization`` of an llm stage, given in the deploy file: the stage's engine quantizes as vLLM's own
``LLM(quantization=...)`` does, with the same greedy tokens. On this CPU build vLLM runs
``int8_per_channel_weight_only`` (float16 / bfloat16 models only); docs/quantization.md lists the rest."""

from __future__ import annotations

import pytest

from omnistage import AsyncOmni
from omnistage.config.loader import ConfigError
from omnistage.engine.builder import resolve_deploy
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.streams import all_outputs
from tests.models.offline_llm import offline_llm

METHOD = "int8_per_channel_weight_only"
ENGINE = dict(max_model_len=256, max_num_seqs=4, dtype="float16", enforce_eager=True)
PROMPTS = ["hello world", "a photo of a red cat"]
GREEDY = dict(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def chat_dir(tiny_model):
    return tiny_model("chat")


@pytest.mark.vllm
@pytest.mark.slow
async def test_llm_stage_quantization_equals_vllm_llm(chat_dir):
    from vllm import SamplingParams

    with offline_llm(chat_dir, quantization=METHOD, **ENGINE) as llm:
        assert llm.llm_engine.model_config.quantization == METHOD
        expected = [
            list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, SamplingParams(**GREEDY), use_tqdm=False)
        ]
    overrides = {"0": {"quantization": METHOD, "engine_output_type": "text+token_ids"}}
    async with AsyncOmni(chat_dir, stage_overrides=overrides, **ENGINE) as omni:
        assert omni.replicas(0)[0].engine.model_config.quantization == METHOD
        got = [
            (await all_outputs(omni.generate(p, sampling_params_list=[dict(GREEDY)])))[-1].token_ids for p in PROMPTS
        ]
    assert got == expected


def test_llm_stage_refuses_a_diffusers_mapping(chat_dir):
    with pytest.raises(ConfigError) as e:
        resolve_deploy(
            resolve_pipeline(str(chat_dir)),
            {
                "stages": [
                    {
                        "stage_id": 0,
                        "quantization": {"quant_backend": "torchao", "quant_kwargs": {"quant_type": "int8wo"}},
                    }
                ]
            },
        )
    assert "stages[0].quantization" in str(e.value) and "vLLM's method name" in str(e.value)
