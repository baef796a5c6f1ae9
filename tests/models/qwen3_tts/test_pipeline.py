"""Qwen3-TTS end to end in-process (talker stage -> decoder stage, async chunk on), against ``qwen-tts``
0.1.1's goldens (conftest.py): every mode's waveform, streamed while the talker runs, streamed == whole,
eight concurrent mixed requests each equal to their solo result, and the offline ``Omni`` API."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni, Omni
from omnistage.testing.streams import all_outputs
from tests.models.qwen3_tts.conftest import CASES, GREEDY, TINY, golden, names, prompt_of

torch.set_num_threads(1)

TOL = 1e-4  # the bar against the reference; measured <= 3.3e-6 (float32 rounding, torch 2.9 vs 2.13)
SAME = 1e-5  # streamed vs whole, both ours


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines():
    out = {kind: AsyncOmni(str(TINY / kind)) for kind in ("custom_voice", "voice_design", "base", "custom_voice_0b6")}
    for e in out.values():
        await e.start()
    yield out
    for e in out.values():
        await e.shutdown()


async def speak(omni, prompt, params=GREEDY, decoder=None):
    """(the audio deltas, the final audio)."""
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[params, decoder]))
    final = outs[-1]
    assert final.finished and final.error is None and final.sample_rate == 24000, final.error
    deltas = [np.asarray(o.delta["audio"]) for o in outs if not o.finished and o.delta.get("audio") is not None]
    return deltas, np.asarray(final.audio)


def diff(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max())


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", list(CASES))
async def test_every_mode_equals_the_reference_and_streams(engines, name):
    omni = engines[CASES[name]["kind"]]
    deltas, audio = await speak(omni, prompt_of(name), decoder={"initial_codec_chunk_frames": 1, "chunk_frames": 4})
    ref = golden(name)["wav"]
    assert diff(audio, ref) <= TOL
    frames = ref.shape[0] // 1920
    expected = [1] + [4] * ((frames - 1) // 4) + ([(frames - 1) % 4] if (frames - 1) % 4 else [])
    assert [len(d) // 1920 for d in deltas] == expected  # the first frame alone, then pieces of chunk_frames
    _, whole = await speak(omni, prompt_of(name), decoder={"initial_codec_chunk_frames": 1000})  # one piece at the end
    assert diff(np.concatenate(deltas), whole) <= SAME


@pytest.mark.asyncio(loop_scope="module")
async def test_eight_concurrent_mixed_requests_each_equal_their_solo_result(engines):
    omni = engines["custom_voice"]
    cases = [names("custom_voice")[i % 4] for i in range(8)]
    chunking = [{"initial_codec_chunk_frames": 1 + i % 3, "chunk_frames": 2 + i % 2} for i in range(8)]
    solo = [(await speak(omni, prompt_of(n)))[1] for n in dict.fromkeys(cases)]
    talker = omni.replicas(0)[0]
    before = len(talker.batch_sizes)
    results = await asyncio.gather(*(speak(omni, prompt_of(n), decoder=c) for n, c in zip(cases, chunking)))
    assert max(list(talker.batch_sizes)[before:]) >= 6  # they shared talker steps
    by_name = dict(zip(dict.fromkeys(cases), solo))
    for n, (_, audio) in zip(cases, results):
        assert diff(audio, by_name[n]) <= SAME, n


@pytest.mark.asyncio(loop_scope="module")
async def test_clone_and_design_requests_run_concurrently(engines):
    jobs = [
        (engines["base"], "vc_icl"),
        (engines["base"], "vc_xvec"),
        (engines["voice_design"], "vd_design"),
        (engines["base"], "vc_icl"),
        (engines["custom_voice"], "cv_dylan_dialect"),
    ]
    results = await asyncio.gather(*(speak(e, prompt_of(n)) for e, n in jobs))
    for (_, n), (_, audio) in zip(jobs, results):
        assert diff(audio, golden(n)["wav"]) <= TOL, n


def test_offline_omni_speaks_like_the_reference():
    with Omni(str(TINY / "custom_voice")) as omni:
        out = omni.generate([prompt_of("cv_vivian"), prompt_of("cv_ryan_instruct")], [GREEDY, None], use_tqdm=False)
    for o, n in zip(out, ["cv_vivian", "cv_ryan_instruct"]):
        assert o.error is None and diff(np.asarray(o.audio), golden(n)["wav"]) <= TOL
