"""The base checkpoint's sampling through ``AsyncOmni`` (fp32, CPU): the same tiny weights with a deterministic
flow-match Euler scheduler (``stochastic_sampling=False``, declared as ``stable_audio3_base``): one request with
and without CFG equals ``StableAudio3Pipeline.__call__``, and the pipeline's defaults (100 steps) are the base
declaration's."""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final

pytestmark = pytest.mark.slow  # an engine start and diffusers' pipeline: 20 s or more

ONE_LOOP = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(stable_audio3_base_dir):
    engine = await AsyncOmni(str(stable_audio3_base_dir)).start()
    yield engine
    await engine.shutdown()


def test_each_folder_gets_its_checkpoints_defaults(stable_audio3_dir, stable_audio3_base_dir):
    import omnistage.models  # noqa: F401 (registers the families)

    distilled, base = resolve_pipeline(str(stable_audio3_dir)), resolve_pipeline(str(stable_audio3_base_dir))
    assert (distilled.name, base.name) == ("stable_audio3", "stable_audio3_base")
    # __call__'s num_inference_steps=None: 8 with the ping-pong scheduler, 100 with the Euler one
    assert distilled.stages[0].default_params == {"num_inference_steps": 8, "guidance_scale": 1.0}
    assert base.stages[0].default_params == {"num_inference_steps": 100, "guidance_scale": 1.0}


@ONE_LOOP
@pytest.mark.parametrize(
    "knobs",
    [
        dict(num_inference_steps=4, guidance_scale=3.0, negative_prompt="static noise"),
        dict(num_inference_steps=4, guidance_scale=1.0),
    ],
    ids=["cfg", "no-cfg"],
)
async def test_euler_equals_diffusers_call(knobs, omni, base_reference):
    kw = dict(knobs)
    negative = kw.pop("negative_prompt", None)
    prompt = {"prompt": "a piano melody", **({"negative_prompt": negative} if negative else {})}
    out = await generate_final(omni, prompt, {"seed": 7, "extra_args": {"duration": 0.2}, **kw})
    expected = base_reference("a piano melody", seed=7, duration=0.2, negative_prompt=negative, **kw)
    assert out.audio.shape == expected.shape
    np.testing.assert_array_equal(out.audio, expected)
