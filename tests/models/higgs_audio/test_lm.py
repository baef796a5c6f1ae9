"""Higgs Audio's LM stage (``HiggsEngine`` on ``stages.ar``) without the orchestrator, against transformers'
``HiggsAudioV2ForConditionalGeneration.generate``: codes solo and in one batch of mixed requests (greedy,
seeded sampling, with and without a scene description, repetition-aware sampling on and off), parameter
checks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistage.config.schema import StageDeployConfig
from omnistage.errors import InvalidRequestError
from omnistage.models.higgs_audio.config import checkpoint_defaults, parse_params
from omnistage.models.higgs_audio.engine import HiggsEngine
from omnistage.pipeline import StageContext, get_pipeline, resolve_pipeline
from omnistage.testing.streams import all_outputs, stage_request
from tests.models.higgs_audio.conftest import conversation

pytestmark = pytest.mark.slow

torch.set_num_threads(1)

STEPS = 14
NO_RAS = {"ras_win_len": 0}
GREEDY = {"temperature": 0, "max_tokens": STEPS, **NO_RAS}
# hot sampling: with the tiny model's peaked logits, a cooler draw would pick the greedy codes
HOT = {"temperature": 3.0, "top_k": 0, "top_p": 0.9, "max_tokens": STEPS, **NO_RAS}
HOT_REF = {"do_sample": True, "temperature": 3.0, "top_k": 0, "top_p": 0.9, "ras_win_len": None}

# (request id, prompt, params, reference messages, reference seed, reference sampling)
CASES = [
    ("plain", {"prompt": "hello there"}, GREEDY, conversation("hello there"), None, {"ras_win_len": None}),
    (
        "scene",
        {
            "prompt": "[SPEAKER0] good morning [SPEAKER1] how are you",
            "speech": {"instructions": "SPEAKER0: feminine"},
        },
        GREEDY,
        conversation("[SPEAKER0] good morning [SPEAKER1] how are you", "SPEAKER0: feminine"),
        None,
        {"ras_win_len": None},
    ),
    ("seeded", {"prompt": "hello world"}, {**HOT, "seed": 7}, conversation("hello world"), 7, HOT_REF),
    (
        "greedy-ras",  # repetition-aware sampling redraws a repeated code even when greedy, from the seed
        {"prompt": "the quick fox"},
        {"temperature": 0, "max_tokens": STEPS, "seed": 3, "ras_win_max_num_repeat": 1},
        conversation("the quick fox"),
        3,
        {"ras_win_max_num_repeat": 1},
    ),
    (
        "ends",  # this seed draws a stream EOS early: the delay pattern ends every codebook, then it stops
        {"prompt": "hello world"},
        {**HOT, "top_p": 1.0, "max_tokens": 40, "seed": 4},
        conversation("hello world"),
        4,
        {**HOT_REF, "top_p": 1.0},
    ),
]


def context(folder, stage_id: int) -> StageContext:
    return StageContext(get_pipeline("higgs_audio").stage(stage_id), StageDeployConfig(stage_id=stage_id), str(folder))


def run_engine(folder, cases):
    async def main():
        engine = HiggsEngine(context(folder, 0))
        await engine.start()
        try:
            outs = await asyncio.gather(
                *(all_outputs(engine.generate(stage_request(rid, prompt, params))) for rid, prompt, params, *_ in cases)
            )
            return outs, list(engine.batch_sizes), list(engine.prefill_sizes)
        finally:
            await engine.shutdown()

    return asyncio.run(main())


def frames_of(outputs) -> torch.Tensor:
    assert outputs[-1].finished and outputs[-1].error is None, outputs[-1]
    return torch.cat([o.data["token_ids"] for o in outputs if o.data.get("token_ids") is not None])


def test_tiny_folder_resolves_to_higgs_audio(higgs_dir):
    assert resolve_pipeline(higgs_dir).name == "higgs_audio"
    assert checkpoint_defaults(higgs_dir) == {
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 0.95,
        "max_tokens": 1500,
        "ras_win_len": 7,
        "ras_win_max_num_repeat": 2,
    }


def test_solo_request_equals_transformers_generate(higgs_dir, reference):
    (out,), batches, _ = run_engine(higgs_dir, CASES[:1])
    *_, messages, seed, sampling = CASES[0]
    ref = reference.run(messages, STEPS, seed, **sampling)
    assert ref.codes.shape == (STEPS - 1 - 3, 4)  # the BOS row, then 3 rows of delay before the first frame
    assert torch.equal(frames_of(out), ref.codes)
    assert set(batches) == {1}
    assert out[-1].finish_reason == "length"


def test_concurrent_requests_equal_transformers_generate(higgs_dir, reference):
    outs, batches, prefills = run_engine(higgs_dir, CASES)
    assert max(batches) == len(CASES)  # all shared steps
    assert prefills == [len(CASES)]  # and one batched prefill
    for (rid, _prompt, params, messages, seed, sampling), out in zip(CASES, outs):
        ref = reference.run(messages, params["max_tokens"], seed, **sampling)
        assert torch.equal(frames_of(out), ref.codes), rid
        assert out[-1].finish_reason == ("stop" if rid == "ends" else "length"), rid
    ends = reference.run(CASES[4][3], 40, 4, **CASES[4][5])
    n = ends.rows.shape[0]
    assert n < 40 and ends.codes.shape[0] == n - 2 - 3  # ended early: less the BOS and EOS rows and the delay
    greedy = reference.run(CASES[0][3], STEPS, None, ras_win_len=None)
    assert not torch.equal(reference.run(CASES[2][3], STEPS, 7, **HOT_REF).codes, greedy.codes)  # it sampled
    plain = reference.run(CASES[3][3], STEPS, None, ras_win_len=None)
    assert not torch.equal(reference.run(CASES[3][3], STEPS, 3, ras_win_max_num_repeat=1).codes, plain.codes)


@pytest.mark.parametrize(
    "params, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 1.5}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -3}, "seed"),
        ({"ras_win_len": -1}, "ras_win_len"),
        ({"min_p": 0.1}, "min_p"),
    ],
)
def test_parameter_checks_name_the_field(params, field):
    defaults = {
        "temperature": 1.0,
        "top_k": 50,
        "top_p": 1.0,
        "max_tokens": 10,
        "ras_win_len": 7,
        "ras_win_max_num_repeat": 2,
    }
    with pytest.raises(InvalidRequestError) as e:
        parse_params(params, defaults)
    assert e.value.field == field
