"""Stable Audio 3 through ``AsyncOmni`` (fp32, CPU), ping-pong sampling (the distilled checkpoint's scheduler):
one request equals ``StableAudio3Pipeline.__call__`` for the same seed (the re-noise of every step drawn from the
request's generator; with and without CFG; at the pipeline's default duration and step count), concurrent
requests of one duration share forwards and each equal their solo run, requests of other durations are kept out
of each other's forwards (the DiT masks no frame), and refused input is named."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.models.stable_audio3.tiny import HOP, SAMPLE_RATE
from omnistage.testing.staggered import generate_final

pytestmark = pytest.mark.slow  # an engine start and diffusers' pipeline: 20 s or more

ONE_LOOP = pytest.mark.asyncio(loop_scope="module")
# Float noise only: rows of several requests in one forward take other CPU matmul blockings than one row alone
# (the same request alone is bit for bit diffusers'). Measured on the waveform (amplitude ~0.4): <= 9e-8.
BATCH_TOL = 1e-6


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(stable_audio3_dir):
    engine = await AsyncOmni(str(stable_audio3_dir)).start()
    yield engine
    await engine.shutdown()


def params(seed: int, duration: float | None = None, **knobs) -> dict:
    p = {"seed": seed, **knobs}
    if duration is not None:
        p["extra_args"] = {"duration": duration}
    return p


CASES = {
    "ping-pong": dict(duration=0.3, num_inference_steps=4),
    "cfg-negative": dict(duration=0.25, num_inference_steps=3, guidance_scale=3.0, negative_prompt="static noise"),
    "cfg-empty-negative": dict(duration=0.2, num_inference_steps=2, guidance_scale=2.0),
    "defaults": dict(),  # __call__'s 10 s and 8 steps
}


@ONE_LOOP
@pytest.mark.parametrize("case", list(CASES))
async def test_solo_equals_diffusers_call(case, omni, reference):
    kw = dict(CASES[case])
    duration = kw.pop("duration", None)
    negative = kw.pop("negative_prompt", None)
    prompt = {"prompt": "rain on a tin roof", **({"negative_prompt": negative} if negative else {})}
    out = await generate_final(omni, prompt, params(11, duration=duration, **kw))
    expected = reference("rain on a tin roof", seed=11, negative_prompt=negative,
                         **({"duration": duration} if duration else {}), **kw)  # fmt: skip
    seconds = duration or 10.0
    assert out.sample_rate == SAMPLE_RATE
    assert out.audio.shape == expected.shape == (2, int(seconds * SAMPLE_RATE))  # stereo, trimmed to the duration
    np.testing.assert_array_equal(out.audio, expected)


@ONE_LOOP
async def test_one_duration_shares_forwards_other_durations_do_not(omni, reference):
    specs = [
        ("a dog barking", params(1, duration=0.3, num_inference_steps=3)),
        ("church bells ringing far away", params(2, duration=0.3, num_inference_steps=4, guidance_scale=2.0)),
        ("waves", params(3, duration=0.29, num_inference_steps=3)),  # 19 frames too (ceil): shares
        ("a cat meowing", params(4, duration=0.5, num_inference_steps=3)),  # 32 frames: its own forwards
    ]
    frames = [math.ceil(kw["extra_args"]["duration"] * SAMPLE_RATE / HOP) for _, kw in specs]
    assert frames == [19, 19, 19, 32]
    solo = [await generate_final(omni, p, kw) for p, kw in specs]
    log = omni.replicas(0)[0].forward_log
    log.clear()
    together = await asyncio.gather(*(generate_final(omni, p, kw) for p, kw in specs))
    by_frames = {19: [], 32: []}
    for key, ids in log:
        by_frames[key[1]].append(set(ids))
    assert max(len(ids) for ids in by_frames[19]) == 3, list(log)  # the three 19-frame clips share forwards
    assert by_frames[32] and all(len(ids) == 1 for ids in by_frames[32]), list(log)  # the 32-frame one: alone
    assert not set.union(*by_frames[32]) & set.union(*by_frames[19]), list(log)
    for (prompt, kw), alone, joint in zip(specs, solo, together):
        assert joint.audio.shape == alone.audio.shape
        np.testing.assert_allclose(joint.audio, alone.audio, rtol=0, atol=BATCH_TOL)
    np.testing.assert_array_equal(together[3].audio, solo[3].audio)  # alone in its forwards: bit for bit
    expected = reference("church bells ringing far away", seed=2, duration=0.3, num_inference_steps=4,
                         guidance_scale=2.0)  # fmt: skip
    np.testing.assert_allclose(together[1].audio, expected, rtol=0, atol=BATCH_TOL)


@ONE_LOOP
@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(duration=0), "duration"),
        (dict(duration=-1.0), "duration"),
        (dict(duration=12.5), "duration"),  # above the duration embedder's max_val (the tiny's 12 s)
        (dict(duration=float("nan")), "duration"),
        (dict(duration="long"), "duration"),
        (dict(duration=0.2, height=64), "height"),
        (dict(duration=0.2, num_outputs_per_prompt=2), "num_outputs_per_prompt"),
    ],
)
async def test_refused_by_name(kw, field, omni):
    duration = kw.pop("duration")
    with pytest.raises(InvalidRequestError) as e:
        await generate_final(omni, "rain", params(1, duration=duration, **kw))
    assert e.value.field == field
