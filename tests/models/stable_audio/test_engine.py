"""Stable Audio through ``AsyncOmni`` (fp32, CPU): one request equals ``StableAudioPipeline.__call__`` for the
same seed (with and without CFG, with a negative prompt, at the default duration), and four concurrent requests
of different durations and seeds share forwards and each equal their solo run."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.models.stable_audio.tiny import MAX_SECONDS, SAMPLE_RATE
from omnistage.testing.staggered import generate_final

pytestmark = pytest.mark.slow  # an engine start and diffusers' pipeline: 20 s or more

ONE_LOOP = pytest.mark.asyncio(loop_scope="module")
# The DiT's timestep MLP sees one timestep per row here where diffusers broadcasts a single one over its CFG
# pair: another GEMM shape, measured 3e-8 apart there and at most 4.2e-7 on the waveform (exact without CFG).
TOL = 2e-6


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(stable_audio_dir):
    engine = await AsyncOmni(str(stable_audio_dir)).start()
    yield engine
    await engine.shutdown()


def params(seed: int, steps: int = 3, duration: float | None = None, **knobs) -> dict:
    p = {"num_inference_steps": steps, "seed": seed, **knobs}
    if duration is not None:
        p["extra_args"] = {"duration": duration}
    return p


CASES = {
    "cfg": dict(duration=0.1, guidance_scale=7.0),
    "negative": dict(duration=0.2, guidance_scale=4.0, negative_prompt="static noise"),
    "no-cfg": dict(duration=0.05, guidance_scale=1.0),
    "default-duration": dict(),
}


@ONE_LOOP
@pytest.mark.parametrize("case", list(CASES))
async def test_solo_equals_diffusers_call(case, omni, reference):
    kw = dict(CASES[case])
    duration = kw.pop("duration", None)
    negative = kw.pop("negative_prompt", None)
    prompt = {"prompt": "rain on a tin roof", **({"negative_prompt": negative} if negative else {})}
    out = await generate_final(omni, prompt, params(11, duration=duration, **kw))
    expected = reference("rain on a tin roof", seed=11, duration=duration, negative_prompt=negative,
                         num_inference_steps=3, **kw)  # fmt: skip
    assert out.sample_rate == SAMPLE_RATE
    assert out.audio.shape == expected.shape == (2, int((duration or MAX_SECONDS) * SAMPLE_RATE))
    np.testing.assert_allclose(out.audio, expected, rtol=0, atol=TOL)
    if kw.get("guidance_scale") == 1.0:
        np.testing.assert_array_equal(out.audio, expected)


@ONE_LOOP
async def test_mixed_durations_share_forwards_and_equal_solo(omni, reference):
    specs = [
        ("a dog barking", params(1, duration=0.05)),
        ("church bells", params(2, duration=0.25, negative_prompt="wind")),
        ("waves on a beach", params(3, duration=0.125, guidance_scale=1.0)),
        ("a cat meowing", params(4, duration=0.2, guidance_scale=3.0)),
    ]
    solo = [await generate_final(omni, p, kw) for p, kw in specs]
    log = omni.replicas(0)[0].forward_log
    log.clear()
    together = await asyncio.gather(*(generate_final(omni, p, kw) for p, kw in specs))
    assert max(len(set(ids)) for _, ids in log) >= 2, list(log)  # requests of different durations in one forward
    for (prompt, kw), alone, joint in zip(specs, solo, together):
        assert joint.audio.shape == alone.audio.shape == (2, int(kw["extra_args"]["duration"] * SAMPLE_RATE))
        # the batch changes the GEMM shapes: float noise only (measured <= 5e-7)
        np.testing.assert_allclose(joint.audio, alone.audio, rtol=0, atol=TOL)
    # and the first against diffusers itself
    expected = reference("a dog barking", seed=1, duration=0.05, num_inference_steps=3)
    np.testing.assert_allclose(together[0].audio, expected, rtol=0, atol=TOL)
