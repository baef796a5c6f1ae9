"""Qwen-Image-Layered over HTTP with the official openai client: ``/v1/images/edits`` (multipart, as OpenAI's)
with ``layers`` answers one RGBA PNG per layer in ``data[]``, in the pipeline's order; an RGBA upload reaches the
pipeline with its alpha (the model reads it), so the layers equal the offline engine's for the same RGBA image and
seed, and are within one uint8 level of diffusers' ``QwenImageLayeredPipeline.__call__``; ``layers`` of 0, below
0 or above the family's maximum is a 400 naming ``layers``."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import torch
from PIL import Image

from omnistage import Omni
from omnistage.models.qwen_image_layered import MAX_LAYERS
from tests.image_http import png
from tests.stages.diffusion.helpers import noise_image, reference_pipeline

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen_image_layered"
BODY = {"seed": 7, "num_inference_steps": 2, "negative_prompt": "blurry"}


@pytest.fixture(scope="module")
def server(family_server):
    return family_server("qwen_image_layered")


def rgba(h: int, w: int, seed: int) -> Image.Image:
    """Seeded RGBA noise: the alpha varies too, so an upload whose alpha was dropped would answer otherwise."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 4), dtype=np.uint8), "RGBA")


def test_an_rgba_upload_answers_as_offline_and_as_diffusers(server):
    folder, client = server
    image = rgba(48, 64, 2)
    resp = client.images.edit(
        model=MODEL, image=("in.png", png(image), "image/png"), prompt="a red cat", extra_body={**BODY, "layers": 3}
    )
    got = [Image.open(io.BytesIO(base64.b64decode(d.b64_json))) for d in resp.data]
    torch.set_num_threads(1)
    with Omni(str(folder)) as omni:
        prompt = {"prompt": "a red cat", "negative_prompt": "blurry", "multi_modal_data": {"image": [image]}}
        params = {"num_inference_steps": 2, "seed": 7, "extra_args": {"layers": 3}}
        [offline] = omni.generate(prompt, [params])
    assert len(got) == len(offline.images) == 3
    for g, o in zip(got, offline.images):  # the same engine in and out of the server: the same bytes
        assert np.array_equal(np.asarray(g), np.asarray(o))
    pipe = reference_pipeline("QwenImageLayeredPipeline", folder)
    [want] = pipe(
        image=image,
        prompt="a red cat",
        negative_prompt="blurry",
        layers=3,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(7),
    ).images
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
