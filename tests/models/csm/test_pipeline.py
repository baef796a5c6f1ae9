"""CSM end to end in-process (``AsyncOmni``: backbone stage -> codec stage, async chunk on), against
transformers' ``generate(..., output_audio=True)``: the waveform, streamed while the backbone runs,
eight concurrent requests each equal to their reference, bad input named."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.speech import SpeechInput
from omnistage.testing.streams import all_outputs
from tests.models.csm.conftest import clip

torch.set_num_threads(1)

FRAMES = 12
TOL = 1e-4  # the bar for waveforms; measured: <= 1e-5 (float32 rounding of different decode lengths)
CLIP = clip(2)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(csm_dir):
    engine = AsyncOmni(csm_dir)
    await engine.start()
    yield engine
    await engine.shutdown()


async def speak(omni, prompt, params, codec=None):
    """The audio updates' deltas and the final output."""
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[params, codec]))
    final = outs[-1]
    assert final.finished and final.error is None and final.sample_rate == 24000
    return [o.delta["audio"] for o in outs if not o.finished and o.delta.get("audio") is not None], final


def close(audio, ref) -> float:
    audio = torch.as_tensor(np.asarray(audio))
    assert audio.shape == ref.shape
    return (audio - ref).abs().max().item()


@pytest.mark.asyncio(loop_scope="module")
async def test_streamed_speech_equals_transformers_and_arrives_in_chunks(omni, reference):
    deltas, final = await speak(
        omni,
        {"prompt": "hello there", "speech": SpeechInput(voice="1")},
        {"temperature": 0, "max_tokens": FRAMES},
        {"initial_codec_chunk_frames": 2, "chunk_frames": 4},
    )
    ref = reference.run([("1", "hello there", None)], FRAMES)
    assert close(final.audio, ref.audio) <= TOL
    assert [len(d) // 1920 for d in deltas] == [2, 4, 4, 2]  # first chunk small, then chunk_frames, then the rest
    assert close(torch.cat([torch.as_tensor(d) for d in deltas]), ref.audio) <= TOL


@pytest.mark.asyncio(loop_scope="module")
async def test_eight_concurrent_requests_each_equal_their_reference(omni, reference):
    hot = {"temperature": 3.0, "top_k": 0, "depth_decoder_temperature": 2.0, "max_tokens": FRAMES}
    hot_ref = {
        "do_sample": True,
        "temperature": 3.0,
        "top_k": 0,
        "depth_decoder_do_sample": True,
        "depth_decoder_temperature": 2.0,
    }
    greedy = {"temperature": 0, "max_tokens": FRAMES}
    cases = []
    for i in range(8):
        speaker = str(i % 2)
        text = ["hello there", "good morning", "the lazy dog", "thank you"][i % 4]
        info = {"voice": speaker}
        turns = [(speaker, text, None)]
        if i % 3 == 0:  # with a reference clip as context
            info.update(ref_audio=(CLIP, 24000), ref_text="a clip of my voice")
            turns.insert(0, (speaker, "a clip of my voice", CLIP))
        seeded = i >= 5
        params = {**hot, "seed": 100 + i} if seeded else greedy
        cases.append(
            (
                {"prompt": text, "speech": info},
                params,
                turns,
                100 + i if seeded else None,
                hot_ref if seeded else {},
            )
        )
    backbone = omni.replicas(0)[0]
    before = len(backbone.batch_sizes)
    results = await asyncio.gather(*(speak(omni, prompt, params) for prompt, params, *_ in cases))
    assert max(list(backbone.batch_sizes)[before:]) >= 4  # requests shared backbone steps
    for (prompt, params, turns, seed, sampling), (_, final) in zip(cases, results):
        assert close(final.audio, reference.run(turns, FRAMES, seed, **sampling).audio) <= TOL, prompt


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "info, params, field",
    [
        ({"voice": "bob"}, {}, "voice"),
        ({"ref_text": "no clip"}, {}, "ref_text"),
        ({"ref_audio": (CLIP, 24000)}, {}, "ref_text"),
        ({"ref_audio": ([], 24000), "ref_text": "empty"}, {}, "ref_audio"),
        ({"instructions": "whisper"}, {}, "instructions"),
        ({"language": "fr"}, {}, "language"),
        ({"context": [{"speaker": "x", "text": "hi", "audio": (CLIP, 24000)}]}, {}, "context[0].speaker"),
        ({}, {"temperature": -1}, "sampling_params_list[0].temperature"),  # the llm-kind knob check of params.py
        ({}, {"stop": ["x"]}, "stop"),
        ({}, {"max_tokens": 2047}, "max_tokens"),  # with the prompt, past the model's 2048 positions
    ],
)
async def test_bad_input_names_the_field(omni, info, params, field):
    with pytest.raises(InvalidRequestError) as e:
        await speak(omni, {"prompt": "hi", "speech": info}, {"max_tokens": 2, **params})
    assert e.value.field == field


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "speech, field",
    [
        ({"voice": 1}, "voice"),
        ({"ref_audio": "clip.wav", "ref_text": "hi"}, "ref_audio"),
        ({"context": [{"speaker": "0", "text": ["hi"], "audio": (CLIP, 24000)}]}, "context[0].text"),
        (SpeechInput(language=5), "language"),
    ],
)
async def test_wrong_typed_speech_fails_at_admission(omni, speech, field):
    backbone = omni.replicas(0)[0]
    before = len(backbone.batch_sizes)
    with pytest.raises(InvalidRequestError) as e:
        await speak(omni, {"prompt": "hi", "speech": speech}, {"max_tokens": 2})
    assert e.value.field == field and e.value.context == ""  # admission's error, not a stage's
    assert len(backbone.batch_sizes) == before  # no stage saw the request


@pytest.mark.asyncio(loop_scope="module")
async def test_empty_text_is_refused(omni):
    with pytest.raises(InvalidRequestError) as e:
        await speak(omni, "   ", {"max_tokens": 2})
    assert e.value.field == "prompt"


@pytest.mark.asyncio(loop_scope="module")
async def test_bad_chunk_size_is_named_by_the_codec_stage(omni):
    with pytest.raises(InvalidRequestError) as e:
        await speak(omni, "hi", {"max_tokens": 2}, {"chunk_frames": 0})
    assert e.value.field == "chunk_frames"


@pytest.mark.asyncio(loop_scope="module")
async def test_abort_mid_stream_frees_the_backbone(omni, reference):
    backbone = omni.replicas(0)[0]
    seen = 0
    async for out in omni.generate(
        "hello there", request_id="abort-me", sampling_params_list=[{"temperature": 0, "max_tokens": 2000}, None]
    ):
        if out.delta.get("audio") is not None:
            seen += 1
            await omni.abort("abort-me")
            break
    assert seen == 1
    for _ in range(100):  # the step in flight when the abort came finishes, then the backbone idles
        if not omni.running_requests() and backbone.stats().running == 0:
            break
        await asyncio.sleep(0.05)
    assert omni.running_requests() == [] and backbone.stats().running == 0
    _, final = await speak(omni, "hello there", {"temperature": 0, "max_tokens": FRAMES})  # it keeps serving
    assert close(final.audio, reference.run([("0", "hello there", None)], FRAMES).audio) <= TOL
