"""Z-Image over HTTP with the official openai client: the PNGs equal diffusers' own ``ZImagePipeline.__call__``
within one uint8 level; bad input is a 400 naming the field. Server in this process, tiny folder."""

from __future__ import annotations

import openai
import pytest
import torch
from PIL import Image

from omnistage import AsyncOmni
from omnistage.testing.server import serve_engine

from .test_flux_http import decode, png, within_one_level

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_model):
    folder = str(tiny_model("z_image"))
    with serve_engine(AsyncOmni(folder), served_model_name="tiny-z") as srv:
        yield folder, openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)


def test_generate_equals_diffusers_call(server):
    from diffusers import ZImagePipeline

    folder, client = server
    resp = client.images.generate(model="tiny-z", prompt="a red cat", size="48x32", n=2,
                                  extra_body={"seed": 3, "num_inference_steps": 4, "guidance_scale": 2.5,
                                              "negative_prompt": "blurry", "cfg_normalization": 1.5})
    torch.set_num_threads(1)
    pipe = ZImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    ref = pipe("a red cat", negative_prompt="blurry", height=32, width=48, num_inference_steps=4, guidance_scale=2.5,
               cfg_normalization=1.5, num_images_per_prompt=2, generator=torch.Generator().manual_seed(3))
    got = [decode(d.b64_json) for d in resp.data]
    assert len(got) == 2 and all(within_one_level(g, r) for g, r in zip(got, ref.images))


def test_bad_input_is_a_400_naming_the_field(server):
    _, client = server
    im = ("in.png", png(Image.new("RGB", (32, 32))), "image/png")
    cases = [
        (lambda: client.images.generate(model="tiny-z", prompt="a cat", size="32x24"), "height"),
        (lambda: client.images.edit(model="tiny-z", image=im, prompt="a cat", size="32x32"), "multi_modal_data.image"),
        (lambda: client.images.generate(model="tiny-z", prompt="a cat", size="32x32",
                                        extra_body={"true_cfg_scale": 2.0}), "true_cfg_scale"),
    ]
    for call, field in cases:
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.body["param"] == field, err.value.body
