"""ERNIE-Image over HTTP with the official openai client: the prompt enhancer's rewrite as each ``data[]`` item's
``revised_prompt`` (OpenAI's field), with PNGs within one uint8 level of diffusers' ``ErnieImagePipeline.__call__``
for the same seed; none with ``use_pe: false``; bad input a 400 naming the field. PNGs with the enhancer off are the
family's row in tests/e2e/test_image_families_http.py."""

from __future__ import annotations

import openai
import pytest
import torch
from PIL import Image

from tests.image_http import decode, png, within_one_level
from tests.stages.diffusion.helpers import reference_pipeline

pytestmark = pytest.mark.slow

MODEL = "tiny-ernie_image"
BODY = {"seed": 3, "num_inference_steps": 2, "guidance_scale": 4.0}


@pytest.fixture(scope="module")
def server(family_server):
    return family_server("ernie_image")  # the harness's server


def test_revised_prompt_per_image_equals_the_pipelines(server):
    folder, client = server
    resp = client.images.generate(model=MODEL, prompt="a red cat", size="48x32", n=2, extra_body=BODY)
    torch.set_num_threads(1)
    ref = reference_pipeline("ErnieImagePipeline", folder)
    torch.manual_seed(3)  # the enhancer samples from the global generator: seeded as the request's seed
    want = ref(
        prompt="a red cat",
        height=32,
        width=48,
        num_images_per_prompt=2,
        num_inference_steps=2,
        guidance_scale=4.0,
        generator=torch.Generator().manual_seed(3),
    )
    assert len(resp.data) == len(want.images) == 2
    for item, image in zip(resp.data, want.images):
        assert item.revised_prompt == want.revised_prompts[0] != "a red cat"
        assert within_one_level(decode(item.b64_json), image)


def test_use_pe_false_answers_no_revised_prompt(server):
    _, client = server
    resp = client.images.generate(model=MODEL, prompt="a red cat", size="48x32", extra_body={**BODY, "use_pe": False})
    assert [d.revised_prompt for d in resp.data] == [None]
    assert "revised_prompt" not in resp.data[0].model_dump(exclude_none=True)


def test_bad_input_is_a_400_naming_the_field(server):
    _, client = server
    im = ("in.png", png(Image.new("RGB", (48, 32))), "image/png")
    cases = [
        (lambda: client.images.generate(model=MODEL, prompt="a cat", size="40x32"), "size"),  # the field sent
        (
            lambda: client.images.generate(model=MODEL, prompt="a cat", size="48x32", extra_body={"use_pe": "maybe"}),
            "use_pe",
        ),
        (lambda: client.images.edit(model=MODEL, image=im, prompt="a cat", size="48x32"), "image"),
    ]
    for call, field in cases:
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.body["param"] == field, err.value.body
