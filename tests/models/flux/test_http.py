"""FLUX.1 over HTTP with the official openai client: ``images.edit`` for Kontext equals diffusers' own
``FluxKontextPipeline.__call__`` within one uint8 level; bad input is a 400 naming the field
(``images.generate`` against ``FluxPipeline`` is the family's row in tests/e2e/test_image_families_http.py). Servers run in this process (uvicorn in a thread) on the tiny folders."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import torch
from PIL import Image

from omnistage import AsyncOmni
from omnistage.testing.server import serve_engine
from tests.image_http import decode, png, within_one_level
from tests.stages.diffusion.helpers import reference_pipeline

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dev(family_server):
    return family_server("flux")  # the harness's server (served as tiny-flux)


@pytest.fixture(scope="module")
def kontext(tiny_model):
    folder = str(tiny_model("flux_kontext"))
    with serve_engine(AsyncOmni(folder), served_model_name="tiny-kontext") as srv:
        yield folder, openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)


def test_kontext_edit_equals_diffusers_call(kontext):
    folder, client = kontext
    src = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 32, 3), dtype=np.uint8))
    resp = client.images.edit(
        model="tiny-kontext",
        image=("in.png", png(src), "image/png"),
        prompt="make it red",
        size="48x32",
        extra_body={
            "seed": 5,
            "num_inference_steps": 3,
            "guidance_scale": 3.0,
            "max_area": 48 * 32,
            "auto_resize": False,
        },
    )
    torch.set_num_threads(1)
    ref = reference_pipeline("FluxKontextPipeline", folder)(
        image=src,
        prompt="make it red",
        height=32,
        width=48,
        num_inference_steps=3,
        guidance_scale=3.0,
        max_area=48 * 32,
        _auto_resize=False,
        generator=torch.Generator().manual_seed(5),
    )
    (data,) = resp.data
    assert within_one_level(decode(data.b64_json), ref.images[0])


def test_bad_input_is_a_400_naming_the_field(dev, kontext):
    _, t2i = dev
    _, edit = kontext
    im = ("in.png", png(Image.new("RGB", (32, 32), (200, 10, 10))), "image/png")
    fast = {"num_inference_steps": 1}
    cases = [
        # the field sent (its width is what the stage checks)
        (lambda: t2i.images.generate(model="tiny-flux", prompt="a cat", size="40x32", extra_body=fast), "size"),
        (
            lambda: t2i.images.generate(
                model="tiny-flux", prompt="a cat", size="32x32", extra_body={**fast, "max_sequence_length": 600}
            ),
            "max_sequence_length",
        ),
        # an edit to a text-to-image-only checkpoint
        (
            lambda: t2i.images.edit(model="tiny-flux", image=im, prompt="a cat", size="32x32", extra_body=fast),
            "image",  # the field sent
        ),
        # Kontext edits one image
        (
            lambda: edit.images.edit(
                model="tiny-kontext", image=[im, im], prompt="a cat", size="32x32", extra_body=fast
            ),
            "image",  # the field sent
        ),
        (
            lambda: edit.images.edit(
                model="tiny-kontext", image=im, prompt="a cat", size="32x32", extra_body={**fast, "max_area": -4}
            ),
            "max_area",
        ),
    ]
    for call, field in cases:
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.status_code == 400
        assert err.value.body["param"] == field, err.value.body
