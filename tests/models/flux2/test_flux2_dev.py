"""FLUX.2 [dev] special cases beyond its row in the shared harness (tests/models/image_families.py):
reference-image edits against diffusers' own ``Flux2Pipeline.__call__`` with the same images (fp32, CPU, same
seed), the declared defaults, and bad input naming the field. One engine for the module."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models import flux2
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final
from tests.models.image_families import by_name
from tests.stages.diffusion.helpers import noise_image, reference_pipeline, tiny_family

ONE_LOOP = pytest.mark.asyncio(loop_scope="module")
DEPLOY = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent"}]}
TEXT = dict(max_sequence_length=64)  # the system turn takes ~40 tiny tokens


folder, _, ref = tiny_family("flux2", reference="Flux2Pipeline")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(folder):
    engine = await AsyncOmni(folder, deploy_config=DEPLOY).start()
    yield engine
    await engine.shutdown()


def test_resolves_and_defaults_are_the_pipelines(folder):
    from diffusers import Flux2Pipeline

    assert resolve_pipeline(folder).name == "flux2"
    sig = inspect.signature(Flux2Pipeline.__call__).parameters
    assert flux2.DEV.stages[0].default_params == {
        "num_inference_steps": sig["num_inference_steps"].default,
        "guidance_scale": sig["guidance_scale"].default,
    }
    assert flux2.adapter.MAX_SEQUENCE_LENGTH == sig["max_sequence_length"].default


@ONE_LOOP
async def test_two_reference_edit_equals_diffusers_call(omni, ref):
    """Two references (floored to 16 and cropped) and the output size defaulting to the first one's."""
    images = [noise_image(80, 64, 1), noise_image(100, 70, 2)]
    kw = dict(num_inference_steps=2, guidance_scale=3.0, **TEXT)
    prompt = {"prompt": "make it red", "multi_modal_data": {"image": images}}
    out = await generate_final(omni, prompt, {**kw, "seed": 5, "output_type": "latent"})
    pics = await generate_final(omni, prompt, {**kw, "seed": 5})
    want = ref(
        image=images, prompt="make it red", generator=torch.Generator().manual_seed(5), output_type="latent", **kw
    ).images
    assert (out.latents - want).abs().max().item() == 0.0
    want = ref(image=images, prompt="make it red", generator=torch.Generator().manual_seed(5), **kw).images[0]
    got = np.asarray(pics.images[0])
    assert got.shape == (80, 64, 3) and np.array_equal(got, np.asarray(want))
    # the references condition the result: without them the same request gives another image
    plain = await generate_final(
        omni, "make it red", {**kw, "height": 80, "width": 64, "seed": 5, "output_type": "latent"}
    )
    assert not torch.allclose(plain.latents, out.latents)


@ONE_LOOP
@pytest.mark.parametrize(
    "prompt,params,field",
    [
        ({"prompt": "a cat", "negative_prompt": "blurry"}, {}, "negative_prompt"),  # no CFG pass to run it in
        ("a cat", dict(true_cfg_scale=3.0), "true_cfg_scale"),
        ("a cat", dict(height=40), "height"),  # not a multiple of 16 (VAE 8 x 2x2 folding)
        ("a cat", dict(max_sequence_length=600), "max_sequence_length"),
    ],
)
async def test_bad_input_names_the_field(omni, prompt, params, field):
    with pytest.raises(InvalidRequestError) as err:
        await generate_final(omni, prompt, {"height": 32, "width": 32, "num_inference_steps": 1, **params})
    assert err.value.field == field


async def test_deploy_refuses_what_the_family_cannot_run(folder):
    """At start-up, naming the family and the feature: no Ulysses plan; LoRA is accepted
    (``Flux2Pipeline.lora_state_dict``) and so is the step cache (test_step_cache_equals_a_plain_reference_loop)."""
    from omnistage.engine.builder import resolve_deploy
    from omnistage.pipeline import StageContext
    from omnistage.transport.process_group import check_supported

    assert resolve_deploy(flux2.DEV, {"stages": [{"stage_id": 0, "enable_lora": True}]}).stage(0).lora_enabled
    deploy = resolve_deploy(
        flux2.DEV, {"stages": [{"stage_id": 0, "devices": "0,1", "parallel_config": {"ulysses_degree": 2}}]}
    )
    ctx = StageContext(flux2.DEV.stages[0], deploy.stage(0), folder, pipeline_name="flux2")
    with pytest.raises(ValueError, match=r"ulysses_degree: pipeline 'flux2' runs \w+, which has no sequence"):
        check_supported(ctx)


@pytest.mark.parametrize("method", ["first_block", "teacache"])
async def test_step_cache_equals_a_plain_reference_loop(folder, method):
    """One cached request equals diffusers' ``Flux2Pipeline.__call__`` around a transformer whose forward is written
    out with the rule in the middle (cache_reference.py: no hooks, no batching): the same latents, the same reused
    steps. The rule decides by step count (warm-up 1, then reuse and compute in turn)."""
    from diffusers import Flux2Transformer2DModel

    from tests.stages.diffusion.cache_reference import Rule, State, flux2_transformer
    from tests.stages.diffusion.helpers import gen, latent, max_diff, run, start_engine

    rule = Rule(method, threshold=1e9, warmup_steps=1, max_consecutive_cached=1)
    kw = dict(num_inference_steps=6, guidance_scale=3.0, height=32, width=48, **TEXT)
    adapter = flux2.Flux2Adapter.load(folder, torch.float32, torch.device("cpu"))
    engine = await start_engine(flux2.DEV, adapter, folder, acceleration={"cache": vars(rule)})
    try:
        outs = await run(engine, "r", "a red cat", seed=4, output_type="latent", **kw)
    finally:
        await engine.shutdown()
    tr = flux2_transformer(rule).from_pretrained(folder, subfolder="transformer")
    tr.state, tr.total = State(), kw["num_inference_steps"]
    pipe = reference_pipeline("Flux2Pipeline", folder, transformer=tr)
    want = pipe(prompt="a red cat", generator=gen(4), output_type="latent", **kw).images
    plain = reference_pipeline(
        "Flux2Pipeline", folder, transformer=Flux2Transformer2DModel.from_pretrained(folder, subfolder="transformer")
    )(prompt="a red cat", generator=gen(4), output_type="latent", **kw).images
    assert outs[-1].metrics.num_steps_reused == tr.state.reused > 0
    assert max_diff(latent(outs), want) <= by_name("flux2").solo_tol  # (why not 0: its row in image_families)
    assert max_diff(want, plain) > 1e-3  # the reused steps change the result: the check above is not vacuous
