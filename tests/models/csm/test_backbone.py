"""CSM's backbone stage (``CsmEngine`` on ``stages.ar``) and codec stage without the orchestrator, against
transformers' ``CsmForConditionalGeneration.generate``: the folder, the codec stage's weights, codes
solo and in one batch of six mixed requests (greedy and seeded, both speakers, with and without
context), streamed Mimi decode, parameter checks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from omnistage.config.schema import StageDeployConfig
from omnistage.errors import InvalidRequestError
from omnistage.models.csm.codec import CsmCodecAdapter
from omnistage.models.csm.config import checkpoint_defaults, parse_params
from omnistage.models.csm.engine import CsmEngine
from omnistage.pipeline import StageContext, get_pipeline, resolve_pipeline
from omnistage.speech import SpeechInput, SpeechTurn
from omnistage.stages.base import StageRequest
from omnistage.stages.generation.engine import GenerationItem
from omnistage.testing.streams import all_outputs
from tests.models.csm.conftest import clip

torch.set_num_threads(1)

FRAMES = 10
GREEDY = {"temperature": 0, "max_tokens": FRAMES}
# hot sampling: with the tiny model's peaked logits, the checkpoint's 0.9 would draw the greedy codes
HOT = {
    "temperature": 3.0,
    "top_k": 0,
    "depth_decoder_temperature": 2.0,
    "depth_decoder_top_k": 20,
    "depth_decoder_top_p": 0.9,
    "max_tokens": FRAMES,
}
HOT_REF = {
    "do_sample": True,
    "temperature": 3.0,
    "top_k": 0,
    "depth_decoder_do_sample": True,
    "depth_decoder_temperature": 2.0,
    "depth_decoder_top_k": 20,
    "depth_decoder_top_p": 0.9,
}


def context(folder, stage_id: int) -> StageContext:
    return StageContext(get_pipeline("csm").stage(stage_id), StageDeployConfig(stage_id=stage_id), str(folder))


# (request id, prompt, params, reference turns, reference seed, reference sampling)
CLIP_A, CLIP_B = clip(0), clip(1, seconds=0.7)
CASES = [
    ("plain-0", {"prompt": "hello there"}, GREEDY, [("0", "hello there", None)], None, {}),
    (
        "plain-1",
        {"prompt": "good morning", "speech": SpeechInput(voice="1")},
        GREEDY,
        [("1", "good morning", None)],
        None,
        {},
    ),
    (
        "ref-1",
        {
            "prompt": "how are you today",
            "speech": SpeechInput(voice="1", ref_audio=(CLIP_A, 24000), ref_text="a clip of my voice"),
        },
        GREEDY,
        [("1", "a clip of my voice", CLIP_A), ("1", "how are you today", None)],
        None,
        {},
    ),
    (
        "context-0",
        {
            "prompt": "i am fine",
            "speech": SpeechInput(
                context=(
                    SpeechTurn(speaker="1", text="how are you", audio=(CLIP_B, 24000)),
                    SpeechTurn(speaker="0", text="the quick fox", audio=(CLIP_A, 24000)),
                )
            ),
        },
        GREEDY,
        [("1", "how are you", CLIP_B), ("0", "the quick fox", CLIP_A), ("0", "i am fine", None)],
        None,
        {},
    ),
    ("seeded-0", {"prompt": "hello world"}, {**HOT, "seed": 7}, [("0", "hello world", None)], 7, HOT_REF),
    (
        "seeded-ref-1",
        {
            "prompt": "the lazy dog",
            "speech": SpeechInput(voice="1", ref_audio=(CLIP_B, 24000), ref_text="thank you"),
        },
        {**HOT, "seed": 11},
        [("1", "thank you", CLIP_B), ("1", "the lazy dog", None)],
        11,
        HOT_REF,
    ),
]


def run_engine(folder, cases):
    async def main():
        engine = CsmEngine(context(folder, 0))
        await engine.start()
        try:
            outs = await asyncio.gather(
                *(
                    all_outputs(
                        engine.generate(StageRequest(rid, {"prompt": p["prompt"]}, params, speech=p.get("speech")))
                    )
                    for rid, p, params, *_ in cases
                )
            )
            return outs, list(engine.batch_sizes)
        finally:
            await engine.shutdown()

    return asyncio.run(main())


def frames_of(outputs) -> torch.Tensor:
    assert outputs[-1].finished and outputs[-1].error is None, outputs[-1]
    return torch.cat([o.data["token_ids"] for o in outputs if o.data.get("token_ids") is not None])


def test_tiny_folder_resolves_to_csm(csm_dir, reference):
    assert resolve_pipeline(csm_dir).name == "csm"
    assert type(reference.processor).__name__ == "CsmProcessor"
    assert checkpoint_defaults(csm_dir) == {
        "temperature": 0.9,
        "top_k": 50,
        "top_p": 1.0,
        "depth_decoder_temperature": 0.9,
        "depth_decoder_top_k": 50,
        "depth_decoder_top_p": 1.0,
        "max_tokens": 125,
    }


def test_codec_stage_loads_the_checkpoints_mimi(csm_dir, reference):
    mine = CsmCodecAdapter(context(csm_dir, 1)).codec.model.state_dict()
    ref = reference.model.codec_model.state_dict()
    assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in ref)


def test_solo_request_equals_transformers_generate(csm_dir, reference):
    (out,), batches = run_engine(csm_dir, CASES[2:3])
    *_, turns, seed, sampling = CASES[2]
    ref = reference.run(turns, FRAMES, seed, **sampling)
    assert torch.equal(frames_of(out), ref.codes)
    assert set(batches) == {1}
    assert out[-1].finish_reason == "length" and out[-1].metrics.num_tokens == FRAMES


def test_six_concurrent_requests_equal_transformers_generate(csm_dir, reference):
    outs, batches = run_engine(csm_dir, CASES)
    assert max(batches) == len(CASES)  # all six shared steps
    for (rid, _prompt, _params, turns, seed, sampling), out in zip(CASES, outs):
        ref = reference.run(turns, FRAMES, seed, **sampling)
        assert ref.codes.shape == (FRAMES, 8)
        assert torch.equal(frames_of(out), ref.codes), rid
    greedy = reference.run(CASES[0][3], FRAMES)
    assert not torch.equal(reference.run(CASES[4][3], FRAMES, 7, **HOT_REF).codes, greedy.codes)  # it really sampled


def test_streamed_decode_equals_transformers_audio(csm_dir, reference):
    """Pieces of 1, 4, 4, 1 frames (as the edge sends them) and a whole request, batched in the codec stage."""
    adapter = CsmCodecAdapter(context(csm_dir, 1))
    a = reference.run(CASES[2][3], FRAMES)
    b = reference.run(CASES[3][3], FRAMES)
    cuts = [0, 1, 5, 9, 10]
    got = []
    state: dict = {}
    for j in range(len(cuts) - 1):
        items = [
            GenerationItem(
                "a", {"codes": a.codes[cuts[j] : cuts[j + 1]].T, "streamed": True}, {}, state, j == len(cuts) - 2
            )
        ]
        if j == 0:
            items.append(GenerationItem("b", {"codes": b.codes.T}, {}, {}, True))
        results = adapter.run(items)
        got.append(results[0]["audio"])
        if j == 0:
            whole_b = results[1]["audio"]
    assert max(adapter.calls) == 2
    streamed = torch.cat(got)
    assert streamed.shape == a.audio.shape == (FRAMES * 1920,)
    assert (streamed - a.audio).abs().max().item() <= 1e-5
    assert (whole_b - b.audio).abs().max().item() <= 1e-5
    assert a.audio.abs().max() > 0.01  # real signal, not silence


@pytest.mark.parametrize(
    "params, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"depth_decoder_top_k": 1.5}, "depth_decoder_top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": -3}, "seed"),
        ({"min_p": 0.1}, "min_p"),
    ],
)
def test_parameter_checks_name_the_field(params, field):
    defaults = {
        "temperature": 0.9,
        "top_k": 50,
        "top_p": 1.0,
        "depth_decoder_temperature": 0.9,
        "depth_decoder_top_k": 50,
        "depth_decoder_top_p": 1.0,
        "max_tokens": 10,
    }
    with pytest.raises(InvalidRequestError) as e:
        parse_params(params, defaults)
    assert e.value.field == field


def test_greedy_request_makes_the_depth_decoder_greedy_too():
    defaults = {
        "temperature": 0.9,
        "top_k": 50,
        "top_p": 1.0,
        "depth_decoder_temperature": 0.9,
        "depth_decoder_top_k": 50,
        "depth_decoder_top_p": 1.0,
        "max_tokens": 10,
    }
    assert parse_params({"temperature": 0}, defaults).depth.temperature == 0
    assert parse_params({"temperature": 0, "depth_decoder_temperature": 0.5}, defaults).depth.temperature == 0.5
    assert parse_params({}, defaults).depth.temperature == 0.9
