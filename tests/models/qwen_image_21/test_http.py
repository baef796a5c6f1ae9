"""Qwen-Image-2.1 edits over HTTP with the official openai client (``images.edit``, multipart uploads, the
declared ``output_resolution`` in ``extra_body``): the PNG is within one uint8 level of diffusers' own
``QwenImage21Pipeline.__call__`` with the same images and seed; a bad ``output_resolution`` is a 400 naming it.
The server is the shared harness's (``family_server``; ``images.generate`` is the row in
test_image_families_http.py)."""

from __future__ import annotations

import openai
import pytest
import torch

from tests.image_http import decode, png, within_one_level
from tests.stages.diffusion.helpers import noise_image

pytestmark = pytest.mark.slow


def test_edit_with_two_images_equals_diffusers_call(family_server):
    from diffusers import QwenImage21Pipeline

    folder, client = family_server("qwen_image_21")
    refs = [noise_image(80, 64, 1), noise_image(64, 96, 2)]
    resp = client.images.edit(
        model="tiny-qwen_image_21",
        image=[(f"{i}.png", png(im), "image/png") for i, im in enumerate(refs)],
        prompt="put them together",
        size="96x64",
        extra_body={
            "seed": 7,
            "num_inference_steps": 2,
            "true_cfg_scale": 2.0,
            "negative_prompt": "blurry",
            "output_resolution": 128,
        },
    )
    torch.set_num_threads(1)
    pipe = QwenImage21Pipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(
        image=refs,
        prompt="put them together",
        negative_prompt="blurry",
        true_cfg_scale=2.0,
        height=64,
        width=96,
        num_inference_steps=2,
        output_resolution=128,
        generator=torch.Generator().manual_seed(7),
    ).images[0]
    (data,) = resp.data
    assert within_one_level(decode(data.b64_json), want)


def test_bad_output_resolution_is_a_400_naming_it(family_server):
    _, client = family_server("qwen_image_21")
    with pytest.raises(openai.BadRequestError) as err:
        client.images.generate(
            model="tiny-qwen_image_21",
            prompt="a cat",
            size="64x64",
            extra_body={"num_inference_steps": 1, "output_resolution": "big"},
        )
    assert err.value.body["param"] == "output_resolution"
