"""FLUX.2 reference-image edits over HTTP: [klein] with the official openai client (``images.edit``, multipart
uploads), [dev] as a JSON edit with ``image_url``; each PNG is within one uint8 level of diffusers' own
``__call__`` with the same images and seed; a reference below diffusers' minimum is a 400 naming the field. The
servers are the shared harness's (``family_server``; ``images.generate`` is the row in
test_image_families_http.py)."""

from __future__ import annotations

import openai
import pytest
import torch

from tests.image_http import decode, png, within_one_level
from tests.stages.diffusion.helpers import noise_image

pytestmark = pytest.mark.slow


def test_edit_with_two_references_equals_diffusers_call(family_server):
    from diffusers import Flux2KleinPipeline

    folder, client = family_server("flux2_klein")
    refs = [noise_image(80, 64, 1), noise_image(64, 96, 2)]
    resp = client.images.edit(
        model="tiny-flux2_klein",
        image=[(f"{i}.png", png(im), "image/png") for i, im in enumerate(refs)],
        prompt="put them together",
        size="64x48",
        extra_body={"seed": 7, "num_inference_steps": 2, "guidance_scale": 2.0, "max_sequence_length": 32},
    )
    torch.set_num_threads(1)
    pipe = Flux2KleinPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(
        image=refs,
        prompt="put them together",
        height=48,
        width=64,
        num_inference_steps=2,
        guidance_scale=2.0,
        max_sequence_length=32,
        generator=torch.Generator().manual_seed(7),
    ).images[0]
    (data,) = resp.data
    assert within_one_level(decode(data.b64_json), want)


def test_small_reference_is_a_400_naming_the_field(family_server):
    _, client = family_server("flux2_klein")
    with pytest.raises(openai.BadRequestError) as err:
        client.images.edit(
            model="tiny-flux2_klein",
            image=("a.png", png(noise_image(32, 32, 0)), "image/png"),
            prompt="a cat",
            size="32x32",
            extra_body={"num_inference_steps": 1},
        )
    assert err.value.body["param"] == "image"


def test_dev_edit_by_image_url_equals_diffusers_call(family_server):
    """FLUX.2 [dev] through a JSON edit with ``image_url`` (data URLs): within one uint8 level of
    ``Flux2Pipeline.__call__`` with the same references and seed."""
    import base64

    import httpx
    from diffusers import Flux2Pipeline

    folder, client = family_server("flux2")
    refs = [noise_image(80, 64, 3), noise_image(64, 96, 4)]
    urls = [f"data:image/png;base64,{base64.b64encode(png(im)).decode()}" for im in refs]
    r = httpx.post(
        f"{client.base_url}images/edits",
        timeout=120,
        json={
            "model": "tiny-flux2",
            "prompt": "put them together",
            "image_url": urls,
            "size": "48x64",
            "seed": 7,
            "num_inference_steps": 2,
            "guidance_scale": 2.5,
            "max_sequence_length": 64,
        },
    )
    assert r.status_code == 200, r.text
    torch.set_num_threads(1)
    pipe = Flux2Pipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(
        image=refs,
        prompt="put them together",
        height=64,
        width=48,
        num_inference_steps=2,
        guidance_scale=2.5,
        max_sequence_length=64,
        generator=torch.Generator().manual_seed(7),
    ).images[0]
    (data,) = r.json()["data"]
    assert within_one_level(decode(data["b64_json"]), want)
