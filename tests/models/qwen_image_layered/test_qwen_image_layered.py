"""Qwen-Image-Layered through ``AsyncOmni`` against diffusers' ``QwenImageLayeredPipeline.__call__`` (fp32, CPU,
same seed and RGBA image): one request alone equals it exactly, latents (the pipeline's last step, read by its
callback: its ``output_type="latent"`` raises in diffusers 0.42.1) and the uint8 RGBA layers in its order;
concurrent requests share forwards and stay within 1e-5 of their solo latents; bad input names the field."""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio
import torch
from PIL import Image

from omnistage import AsyncOmni, InvalidRequestError
from omnistage.models.qwen_image_layered import MAX_LAYERS
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.staggered import generate_final, solo_then_staggered
from tests.stages.diffusion.helpers import tiny_family

pytestmark = pytest.mark.slow
ONE_LOOP = pytest.mark.asyncio(loop_scope="module")
DEPLOY = {"stages": [{"stage_id": 0, "engine_output_type": "image,latent"}]}

folder, _, ref = tiny_family("qwen_image_layered", reference="QwenImageLayeredPipeline")


def rgba(h: int, w: int, seed: int) -> Image.Image:
    """Seeded RGBA noise: the alpha varies too, so a family that dropped it would differ."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 4), dtype=np.uint8), "RGBA")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(folder):
    async with AsyncOmni(folder, deploy_config=DEPLOY) as engine:
        yield engine


def request(prompt: str, image: Image.Image, negative: str | None = None) -> dict:
    out = {"prompt": prompt, "multi_modal_data": {"image": [image]}}
    return out if negative is None else {**out, "negative_prompt": negative}


def reference(ref, image, prompt, negative, seed, steps, **kw):
    """The pipeline's layers and its last step's latents."""
    seen: dict = {}

    def keep(pipe, i, t, kwargs):
        seen["latents"] = kwargs["latents"]
        return {}

    out = ref(
        image=image,
        prompt=prompt,
        negative_prompt=negative,
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        callback_on_step_end=keep,
        **kw,
    )
    return [layer for row in out.images for layer in row], seen["latents"]


def test_folder_resolves(folder):
    assert resolve_pipeline(folder).name == "qwen_image_layered"


@ONE_LOOP
@pytest.mark.parametrize(
    "size,kw,negative",
    [
        ((48, 64), dict(layers=2), "blurry"),  # true CFG (the default scale 4 with a negative)
        ((64, 48), dict(layers=3, cfg_normalize=True, true_cfg_scale=2.5), "dark"),
        ((40, 40), dict(layers=1, num_images_per_prompt=2), None),  # no CFG, two outputs of one layer
    ],
    ids=["two-layers-cfg", "three-layers-cfg-normalize", "one-layer-two-outputs"],
)
async def test_layers_equal_diffusers_call(omni, ref, size, kw, negative):
    image = rgba(*size, seed=3)
    n = kw.pop("num_images_per_prompt", 1)
    scale = kw.pop("true_cfg_scale", None)
    params = {"num_inference_steps": 2, "seed": 5, "num_outputs_per_prompt": n, "extra_args": kw}
    if scale is not None:
        params["true_cfg_scale"] = scale
    latents = await generate_final(omni, request("a red cat", image, negative), {**params, "output_type": "latent"})
    out = await generate_final(omni, request("a red cat", image, negative), params)
    more = {} if scale is None else {"true_cfg_scale": scale}
    want, want_latents = reference(ref, image, "a red cat", negative, 5, 2, num_images_per_prompt=n, **kw, **more)
    assert torch.equal(latents.latents, want_latents)
    assert len(out.images) == len(want) == n * kw["layers"]
    for got, w in zip(out.images, want):
        assert got.mode == w.mode == "RGBA" and got.size == w.size
        assert np.array_equal(np.asarray(got), np.asarray(w))


@ONE_LOOP
async def test_concurrent_requests_share_forwards(omni):
    image = rgba(48, 64, seed=1)
    specs = [
        (request("a red cat", image, "blurry"), {"num_inference_steps": 4, "seed": 1, "extra_args": {"layers": 2}}),
        (request("green square", image), {"num_inference_steps": 3, "seed": 2, "extra_args": {"layers": 2}}),
        (
            request("a city skyline at night", image, "dark"),
            {"num_inference_steps": 3, "seed": 3, "extra_args": {"layers": 2}},
        ),
    ]
    specs = [(p, {**kw, "output_type": "latent"}) for p, kw in specs]
    solo, together, forwards = await solo_then_staggered(omni, specs)
    for s, t in zip(solo, together):
        # padded, masked prompts of other lengths in the same forward move the float sums by rounding alone
        assert (s.latents - t.latents).abs().max().item() <= 1e-5 * max(1.0, s.latents.abs().max().item())
    assert max(len(ids) for ids in forwards) >= 2
    assert not torch.equal(together[0].latents, together[1].latents)


@ONE_LOOP
@pytest.mark.parametrize(
    "extra,params,images,field",
    [
        ({"layers": 0}, {}, 1, "layers"),
        ({"layers": -1}, {}, 1, "layers"),
        ({"layers": MAX_LAYERS + 1}, {}, 1, "layers"),
        ({"resolution": 700}, {}, 1, "resolution"),
        ({}, {"height": 64}, 1, "height"),
        ({}, {}, 0, "multi_modal_data.image"),
        ({}, {}, 2, "multi_modal_data.image"),
    ],
)
async def test_bad_input_names_the_field(omni, extra, params, images, field):
    prompt: dict = {"prompt": "a cat"}
    if images:
        prompt["multi_modal_data"] = {"image": [rgba(32, 32, i) for i in range(images)]}
    with pytest.raises(InvalidRequestError) as err:
        await generate_final(omni, prompt, {"num_inference_steps": 1, "extra_args": extra, **params})
    assert err.value.field == field


@ONE_LOOP
async def test_blank_prompt_is_the_text_encoders_caption(omni, ref):
    """The pipeline's rule for a blank prompt: its text encoder captions the image (greedy), and that is drawn."""
    image = rgba(48, 64, seed=4)
    params = {"num_inference_steps": 2, "seed": 6, "extra_args": {"layers": 1}}
    out = await generate_final(omni, request(" ", image), params)
    want, _ = reference(ref, image, " ", None, 6, 2, layers=1)
    assert np.array_equal(np.asarray(out.images[0]), np.asarray(want[0]))
