"""Higgs Audio end to end in-process (``AsyncOmni``: LM stage -> decoder stage, async chunk on): the waveform
against the reference's (golden: transformers' ``generate`` greedy + ``HiggsAudioV2Processor.decode``),
a cloned voice (``ref_audio`` + ``ref_text``), streamed while the LM runs and equal to the whole decode, five mixed concurrent requests (one cloning) each
equal to their solo run, bad input named."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.testing.streams import all_outputs
from tests.models.higgs_audio.conftest import conversation, golden

pytestmark = pytest.mark.slow

torch.set_num_threads(1)

TOL = 1e-5  # measured 2.8e-9 vs the reference: float32 rounding of the decoder's streamed blocks vs one whole decode
GREEDY = {"temperature": 0, "ras_win_len": 0}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(higgs_dir):
    engine = AsyncOmni(higgs_dir)
    await engine.start()
    yield engine
    await engine.shutdown()


async def speak(omni, prompt, params, codec=None):
    """The audio updates' deltas and the final output."""
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[params, codec]))
    final = outs[-1]
    assert final.finished and final.error is None and final.sample_rate == 24000
    return [o.delta["audio"] for o in outs if not o.finished and o.delta.get("audio") is not None], final


def gap(audio, ref) -> float:
    audio, ref = torch.as_tensor(np.asarray(audio)), torch.as_tensor(np.asarray(ref))
    assert audio.shape == ref.shape
    return (audio - ref).abs().max().item()


@pytest.mark.asyncio(loop_scope="module")
async def test_speech_equals_the_reference(omni):
    ref = golden("plain")
    _, final = await speak(omni, str(ref["text"]), {**GREEDY, "max_tokens": int(ref["steps"])})
    assert gap(final.audio, ref["wav"]) <= TOL
    assert np.abs(ref["wav"]).max() > 1e-3


@pytest.mark.asyncio(loop_scope="module")
async def test_cloned_voice_equals_the_reference(omni):
    ref = golden("clone")
    info = {"ref_audio": (ref["clip"], 24000), "ref_text": str(ref["ref_text"])}
    _, final = await speak(
        omni, {"prompt": str(ref["text"]), "speech": info}, {**GREEDY, "max_tokens": int(ref["steps"])}
    )
    assert gap(final.audio, ref["wav"]) <= TOL
    plain = golden("plain")  # the same text without the clip: other codes, another waveform
    assert not np.array_equal(plain["rows"], ref["rows"][-len(plain["rows"]) :])
    assert gap(plain["wav"], ref["wav"]) > 10 * TOL


@pytest.mark.asyncio(loop_scope="module")
async def test_streamed_speech_arrives_in_chunks_and_equals_the_whole_decode(omni, reference, higgs_dir):
    from omnistage.models.shared.higgs_tokenizer.decoder import HiggsCodec

    steps = 60
    deltas, final = await speak(
        omni, "hello there", {**GREEDY, "max_tokens": steps}, {"initial_codec_chunk_frames": 2, "chunk_frames": 8}
    )
    sizes = [len(d) // 960 for d in deltas]
    assert len(sizes) > 2 and sizes[0] == 2 and sum(sizes) == steps - 1 - 3
    codes = reference.run(conversation("hello there"), steps, ras_win_len=None).codes  # transformers' generate
    whole = HiggsCodec(higgs_dir / "audio_tokenizer").decode(codes.T.unsqueeze(0))[0]  # equal to the reference's
    assert gap(torch.cat([torch.as_tensor(d) for d in deltas]), whole) <= TOL
    assert gap(final.audio, whole) <= TOL


@pytest.mark.asyncio(loop_scope="module")
async def test_five_mixed_concurrent_requests_equal_their_solo_runs(omni):
    cases = [
        ("hello there", {**GREEDY, "max_tokens": 20}),
        (
            {"prompt": "good morning", "speech": {"instructions": "SPEAKER0: feminine"}},
            {**GREEDY, "max_tokens": 26},
        ),
        ("[SPEAKER0] hi [SPEAKER1] how are you", {"temperature": 3.0, "top_k": 0, "seed": 5, "max_tokens": 24}),
        ("the quick fox", {"temperature": 0, "seed": 9, "ras_win_max_num_repeat": 1, "max_tokens": 30}),
    ]
    clone = golden("clone")  # a prompt with audio frames in the same batched prefill as prompts without
    info = {"ref_audio": (clone["clip"], 24000), "ref_text": str(clone["ref_text"])}
    cases.append(({"prompt": "hello there", "speech": info}, {**GREEDY, "max_tokens": 22}))
    solo = [(await speak(omni, prompt, params))[1].audio for prompt, params in cases]
    lm = omni.replicas(0)[0]
    before = len(lm.batch_sizes)
    results = await asyncio.gather(*(speak(omni, prompt, params) for prompt, params in cases))
    assert max(list(lm.batch_sizes)[before:]) >= 3  # the requests shared LM steps
    assert max(list(lm.prefill_sizes)[-len(cases) :]) >= 3  # and prefills
    for (prompt, _), alone, (_, final) in zip(cases, solo, results):
        assert gap(final.audio, alone) <= TOL, prompt


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "info, params, field",
    [
        ({"voice": "bob"}, {}, "voice"),
        ({"instructions": 3}, {}, "instructions"),
        ({"ref_audio": (np.zeros(24000, np.float32), 24000)}, {}, "ref_text"),
        ({"ref_text": "no clip"}, {}, "ref_text"),
        ({"ref_audio": ([], 24000), "ref_text": "empty"}, {}, "ref_audio"),
        ({"ref_audio": (np.zeros(31 * 24000, np.float32), 24000), "ref_text": "too long"}, {}, "ref_audio"),
        ({}, {"temperature": -1}, "sampling_params_list[0].temperature"),
        ({}, {"max_tokens": 2047}, "max_tokens"),  # with the prompt, past the model's 2048 positions
    ],
)
async def test_bad_input_names_the_field(omni, info, params, field):
    with pytest.raises(InvalidRequestError) as e:
        await speak(omni, {"prompt": "hi", "speech": info}, {"max_tokens": 8, **params})
    assert e.value.field == field


@pytest.mark.asyncio(loop_scope="module")
async def test_empty_text_is_refused(omni):
    with pytest.raises(InvalidRequestError) as e:
        await speak(omni, "   ", {"max_tokens": 8})
    assert e.value.field == "prompt"
