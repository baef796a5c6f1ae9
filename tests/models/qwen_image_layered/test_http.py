"""Qwen-Image-Layered over HTTP with the official openai client: ``/v1/images/edits`` (multipart, as OpenAI's)
with ``layers`` answers one RGBA PNG per layer in ``data[]``, in the pipeline's order, each within one uint8 level
of diffusers' ``QwenImageLayeredPipeline.__call__`` for the same image and seed; ``layers`` of 0, below 0 or above
the family's maximum is a 400 naming ``layers``. The upload is decoded as every image input is (RGB: its alpha is
not kept), so the reference gets that RGB picture as RGBA."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import torch
from PIL import Image

from omnistage.models.qwen_image_layered import MAX_LAYERS
from tests.image_http import png
from tests.stages.diffusion.helpers import noise_image, reference_pipeline

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen_image_layered"
BODY = {"seed": 7, "num_inference_steps": 2, "negative_prompt": "blurry"}


@pytest.fixture(scope="module")
def server(family_server):
    return family_server("qwen_image_layered")


def test_layers_are_rgba_pngs_in_the_pipelines_order(server):
    folder, client = server
    image = noise_image(48, 64, 2)
    resp = client.images.edit(
        model=MODEL, image=("in.png", png(image), "image/png"), prompt="a red cat", extra_body={**BODY, "layers": 3}
    )
    torch.set_num_threads(1)
    pipe = reference_pipeline("QwenImageLayeredPipeline", folder)
    [want] = pipe(
        image=image.convert("RGBA"),
        prompt="a red cat",
        negative_prompt="blurry",
        layers=3,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(7),
    ).images
    got = [Image.open(io.BytesIO(base64.b64decode(d.b64_json))) for d in resp.data]
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g.mode == w.mode == "RGBA" and g.size == w.size
        assert int(np.abs(np.asarray(g).astype(int) - np.asarray(w).astype(int)).max()) <= 1
    assert not np.array_equal(np.asarray(got[0]), np.asarray(got[1]))  # the layers differ


@pytest.mark.parametrize("layers", [0, -1, MAX_LAYERS + 1])
def test_layers_out_of_range_is_a_400_naming_layers(server, layers):
    _, client = server
    with pytest.raises(openai.BadRequestError) as err:
        client.images.edit(
            model=MODEL,
            image=("in.png", png(noise_image(32, 32, 0)), "image/png"),
            prompt="a cat",
            extra_body={"num_inference_steps": 1, "layers": layers},
        )
    assert err.value.body["param"] == "layers", err.value.body


def test_generations_without_an_image_is_a_400_naming_it(server):
    _, client = server
    with pytest.raises(openai.BadRequestError) as err:
        client.images.generate(model=MODEL, prompt="a cat", extra_body={"num_inference_steps": 1})
    assert err.value.body["param"] == "image", err.value.body
