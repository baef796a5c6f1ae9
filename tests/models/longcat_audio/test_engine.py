"""LongCat-AudioDiT through ``AsyncOmni`` (fp32, CPU): one request equals ``LongCatAudioDiTPipeline.__call__`` for
the same seed (with and without CFG, with a negative prompt, with the duration estimated from the prompt), and
four concurrent requests of different durations, prompt lengths and seeds share forwards where their padded
latent lengths match and each equal their solo run."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.models.longcat_audio.tiny import HOP, SAMPLE_RATE
from omnistage.testing.staggered import generate_final

pytestmark = pytest.mark.slow  # an engine start and diffusers' pipeline: 20 s or more

ONE_LOOP = pytest.mark.asyncio(loop_scope="module")
# Float noise only: diffusers runs cond and uncond as two batch-1 forwards over unpadded latents and text; here
# they share one forward, with latents padded to the frame bucket and text to the longest prompt (both masked).
# Measured on the DiT's output (amplitude ~1.5): <= 6e-7 for each of the three; on the waveform (amplitude ~1)
# <= 9.1e-7.
TOL = 5e-6


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(longcat_audio_dir):
    engine = await AsyncOmni(str(longcat_audio_dir)).start()
    yield engine
    await engine.shutdown()


def params(seed: int, steps: int = 3, duration: float | None = None, **knobs) -> dict:
    p = {"num_inference_steps": steps, "seed": seed, **knobs}
    if duration is not None:
        p["extra_args"] = {"duration": duration}
    return p


def frames(duration: float) -> int:
    return int(duration * SAMPLE_RATE // HOP)


CASES = {
    "cfg": dict(duration=0.3, guidance_scale=4.0),
    "negative": dict(duration=0.25, guidance_scale=3.0, negative_prompt="static noise"),
    "no-cfg": dict(duration=0.2, guidance_scale=1.0),
    "no-cfg-whole-bucket": dict(duration=0.256, guidance_scale=1.0),  # 16 frames: no padding, no CFG row
    "duration-from-prompt": dict(),  # the pipeline's estimate from the prompt's characters, default guidance
}


@ONE_LOOP
@pytest.mark.parametrize("case", list(CASES))
async def test_solo_equals_diffusers_call(case, omni, reference):
    kw = dict(CASES[case])
    duration = kw.pop("duration", None)
    negative = kw.pop("negative_prompt", None)
    prompt = {"prompt": "Rain on a “tin” roof", **({"negative_prompt": negative} if negative else {})}
    out = await generate_final(omni, prompt, params(11, duration=duration, **kw))
    expected = reference("Rain on a “tin” roof", seed=11, duration=duration, negative_prompt=negative,
                         num_inference_steps=3, **kw)  # fmt: skip
    assert out.sample_rate == SAMPLE_RATE
    assert out.audio.shape == expected.shape
    if duration is not None:
        assert expected.shape == (frames(duration) * HOP,)  # the latent length is the duration
    np.testing.assert_allclose(out.audio, expected, rtol=0, atol=TOL)
    if case == "no-cfg-whole-bucket":  # the same shapes as diffusers' forwards: bit for bit
        np.testing.assert_array_equal(out.audio, expected)


@ONE_LOOP
async def test_mixed_durations_share_forwards_and_equal_solo(omni, reference):
    specs = [
        ("a dog barking", params(1, duration=0.1)),  # 6 frames, padded to 16
        ("church bells ringing far away on a sunday morning", params(2, duration=0.25, negative_prompt="wind")),
        ("waves", params(3, duration=0.2, guidance_scale=1.0)),  # 12 frames
        ("a cat meowing", params(4, duration=0.4, guidance_scale=2.0)),  # 25 frames: the next bucket (32)
    ]
    solo = [await generate_final(omni, p, kw) for p, kw in specs]
    log = omni.replicas(0)[0].forward_log
    log.clear()
    together = await asyncio.gather(*(generate_final(omni, p, kw) for p, kw in specs))
    # the three clips of 6, 15 and 12 frames (prompts of different lengths) denoise in the same forwards
    assert max(len(set(ids)) for _, ids in log) == 3, list(log)
    for (prompt, kw), alone, joint in zip(specs, solo, together):
        assert joint.audio.shape == alone.audio.shape == (frames(kw["extra_args"]["duration"]) * HOP,)
        np.testing.assert_allclose(joint.audio, alone.audio, rtol=0, atol=TOL)
    # and against diffusers itself
    expected = reference("church bells ringing far away on a sunday morning", seed=2, duration=0.25,
                         negative_prompt="wind", num_inference_steps=3)  # fmt: skip
    np.testing.assert_allclose(together[1].audio, expected, rtol=0, atol=TOL)


@ONE_LOOP
@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(duration=0), "duration"),
        (dict(duration=-1.0), "duration"),
        (dict(duration=30.5), "duration"),  # longer than the pipeline's 30 s
        (dict(duration=float("nan")), "duration"),
        (dict(duration=0.2, height=64), "height"),
    ],
)
async def test_refused_by_name(kw, field, omni):
    duration = kw.pop("duration")
    with pytest.raises(InvalidRequestError) as e:
        await generate_final(omni, "rain", params(1, duration=duration, **kw))
    assert e.value.field == field
