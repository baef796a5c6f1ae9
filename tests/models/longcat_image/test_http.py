"""LongCat-Image-Edit over HTTP: ``/v1/images/edits`` as a multipart upload (the official openai client) and as
JSON with an ``image_url`` (a data URL, httpx) both give PNGs within one uint8 level of diffusers' own
``LongCatImageEditPipeline.__call__`` with the same image and seed; a size the image does not give is a 400
naming the field. Text-to-image is the family's row in test_image_families_http.py."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest
import torch

from tests.image_http import decode, png, within_one_level
from tests.stages.diffusion.helpers import noise_image

pytestmark = pytest.mark.slow

BODY = {"seed": 7, "num_inference_steps": 2, "guidance_scale": 3.0, "negative_prompt": "blurry"}


def test_edit_multipart_and_image_url_equal_diffusers_call(family_server):
    from diffusers import LongCatImageEditPipeline

    folder, client = family_server("longcat_image_edit")
    im = noise_image(60, 80, 1)  # 4:3 -> 1184x896 out
    resp = client.images.edit(
        model="tiny-longcat_image_edit", image=("a.png", png(im), "image/png"), prompt="make it red", extra_body=BODY
    )
    url = "data:image/png;base64," + base64.b64encode(png(im)).decode()
    by_url = httpx.post(
        f"{client.base_url}images/edits",
        timeout=300,
        json={"model": "tiny-longcat_image_edit", "prompt": "make it red", "image_url": url, **BODY},
    )
    assert by_url.status_code == 200, by_url.text
    torch.set_num_threads(1)
    pipe = LongCatImageEditPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(
        image=im,
        prompt="make it red",
        negative_prompt="blurry",
        num_inference_steps=2,
        guidance_scale=3.0,
        generator=torch.Generator().manual_seed(7),
    ).images[0]
    assert want.size == (1184, 896)
    (data,) = resp.data
    assert within_one_level(decode(data.b64_json), want)
    (data,) = by_url.json()["data"]
    assert within_one_level(decode(data["b64_json"]), want)


def test_size_the_image_does_not_give_is_a_400_naming_the_field(family_server):
    _, client = family_server("longcat_image_edit")
    with pytest.raises(openai.BadRequestError) as err:
        client.images.edit(
            model="tiny-longcat_image_edit",
            image=("a.png", png(noise_image(64, 64, 0)), "image/png"),
            prompt="a cat",
            size="512x512",
            extra_body={"num_inference_steps": 1},
        )
    assert err.value.body["param"] == "size" and "1024x1024" in err.value.body["message"]  # the field sent
