"""XTTS v2 end to end in-process, against coqui-tts 0.28.0's goldens (conftest.py), within one 16-bit step:

- streamed (``AsyncOmni``, async chunk on): the decoder's pieces are ``Xtts.inference_stream``'s pieces, for
  two seeds and chunk sizes; three such requests at once, sharing GPT steps, each equal to the reference's
  request alone; the clip's conditioning computed once for all of them (cached by content);
- whole (offline ``Omni``): ``Xtts.inference``'s waveform, three requests in one call (``speed`` included), and
  texts through the text front end (a price, Chinese, Japanese) in the same call; a text over its language's
  character limit, not split, spoken whole as one sentence (the release warns and speaks it);
- bad input named.

A text split into sentences (``enable_text_splitting``) is tested over HTTP (test_http.py): one process loads
spaCy for it.

Goldens: ``scripts/reference/xtts/setup.sh`` (``run_reference.py`` and ``frontend_goldens.py``) regenerates them.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni, Omni
from omnistage.errors import InvalidRequestError
from omnistage.testing.streams import all_outputs
from tests.models.xtts.conftest import (
    CASES,
    FRONTEND,
    STREAMS,
    golden,
    pcm,
    stream_pieces,
    within_one_step,
)

pytestmark = pytest.mark.slow

torch.set_num_threads(1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(xtts_dir):
    engine = AsyncOmni(xtts_dir)
    await engine.start()
    yield engine
    await engine.shutdown()


def request(name: str, clip, **speech) -> dict:
    text, language, _, _ = CASES[name]
    return {"prompt": text, "speech": {"ref_audio": clip, "language": language, **speech}}


async def speak(omni, prompt, params, decoder=None):
    """The audio deltas and the final output."""
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[params, decoder]))
    final = outs[-1]
    assert final.finished and final.error is None and final.sample_rate == 24000
    return [o.delta["audio"] for o in outs if not o.finished and o.delta.get("audio") is not None], final


async def streamed(omni, clip, name):
    case, seed, chunk = STREAMS[name]
    return await speak(omni, request(case, clip), {"seed": seed}, {"chunk_frames": chunk})


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", list(STREAMS))
async def test_streamed_pieces_equal_the_references_stream(omni, clip, name):
    deltas, final = await streamed(omni, clip, name)
    ref = stream_pieces(name)
    assert len(deltas) == len(ref) >= 3
    for got, want in zip(deltas, ref):
        within_one_step(got, want) if np.abs(want).max() > 1000 else np.testing.assert_allclose(pcm(got), want, atol=1)
    assert np.array_equal(pcm(final.audio), np.concatenate([pcm(d) for d in deltas]))


@pytest.mark.asyncio(loop_scope="module")
async def test_three_at_once_each_equal_alone_and_one_conditioning(omni, clip):
    """Each equal to the reference's stream of the same request alone (goldens)."""
    gpt = omni.replicas(0)[0]
    before = len(gpt.batch_sizes)
    names = ["es_seed0", "en_seed1234", "en_seed1234"]
    results = await asyncio.gather(*(streamed(omni, clip, n) for n in names))
    assert max(list(gpt.batch_sizes)[before:]) >= 3  # the requests shared GPT steps
    for name, (deltas, _) in zip(names, results):
        ref = stream_pieces(name)
        assert len(deltas) == len(ref)
        for got, want in zip(deltas, ref):
            assert np.abs(pcm(got).astype(int) - want).max() <= 1
    assert gpt.conditioning_runs == 1  # one clip: its conditioning computed once, whatever the requests
    other = (clip[0][: clip[0].size // 2] * 0.5, clip[1])
    await speak(omni, {"prompt": "hello", "speech": {"ref_audio": other}}, {"temperature": 0, "max_tokens": 2})
    assert gpt.conditioning_runs == 2


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "speech, params, decoder, field",
    [
        ({"language": "klingon"}, {}, None, "language"),
        ({"voice": "bob"}, {}, None, "voice"),
        ({"ref_audio": None}, {}, None, "ref_audio"),
        ({"ref_audio": (np.zeros(22050, np.float32), 22050)}, {}, None, "ref_audio"),  # silent
        ({"ref_audio": (np.ones(2000, np.float32) * 0.1, 22050)}, {}, None, "ref_audio"),  # 0.09 s
        ({"ref_audio": (np.ones(31 * 8000, np.float32) * 0.1, 8000)}, {}, None, "ref_audio"),  # 31 s
        ({"speed": 0}, {}, None, "speed"),
        ({}, {"temperature": -1}, None, "sampling_params_list[0].temperature"),
        ({}, {"max_tokens": 100}, None, "max_tokens"),
        ({}, {}, {"chunk_frames": 0}, "chunk_frames"),
        ({}, {}, {"initial_codec_chunk_frames": 2}, "initial_codec_chunk_frames"),
    ],
)
async def test_bad_input_names_the_field(omni, clip, speech, params, decoder, field):
    prompt = {"prompt": "hello there", "speech": {"ref_audio": clip, **speech}}
    if speech.get("ref_audio", 0) is None:
        prompt["speech"].pop("ref_audio")
    with pytest.raises(InvalidRequestError) as e:
        await speak(omni, prompt, {"max_tokens": 4, **params}, decoder)
    assert e.value.field.endswith(field)


def test_offline_whole_speech_equals_the_references_inference(xtts_dir, clip):
    names = ["greedy_en", "greedy_es", "slow_en"]
    prompts = [request(n, clip, **({"speed": CASES[n][3]} if CASES[n][3] != 1 else {})) for n in names]
    spoken = ["price_en", "zh", "ja"]
    prompts += [{"prompt": FRONTEND[n][0], "speech": {"ref_audio": clip, "language": FRONTEND[n][1]}} for n in spoken]
    # over Japanese's 71 characters without splitting: the release warns and speaks it whole, as one sentence
    prompts.append({"prompt": FRONTEND["split_ja"][0], "speech": {"ref_audio": clip, "language": "ja"}})
    with Omni(model=str(xtts_dir)) as omni:
        outs = omni.generate(prompts, sampling_params_list=[{"temperature": 0}, None])
    for name, out in zip([f"whole_{n}" for n in names] + [f"frontend_{n}" for n in spoken], outs):
        assert out.error is None, out.error
        within_one_step(np.asarray(out.audio), golden(name)["pcm"])
    unsplit = outs[-1]
    assert unsplit.error is None and 0 < np.asarray(unsplit.audio).size < golden("frontend_split_ja")["pcm"].size
