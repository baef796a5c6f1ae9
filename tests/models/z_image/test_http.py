"""Z-Image over HTTP with the official openai client: bad input is a 400 naming the field (PNGs against
diffusers' ``ZImagePipeline.__call__`` are the family's row in tests/e2e/test_image_families_http.py)."""

from __future__ import annotations

import openai
import pytest
from PIL import Image

from tests.image_http import png

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(family_server):
    return family_server("z_image")  # the harness's server (served as tiny-z_image)


def test_bad_input_is_a_400_naming_the_field(server):
    _, client = server
    im = ("in.png", png(Image.new("RGB", (32, 32))), "image/png")
    cases = [
        (lambda: client.images.generate(model="tiny-z_image", prompt="a cat", size="32x24"), "size"),  # the field sent
        (
            lambda: client.images.edit(model="tiny-z_image", image=im, prompt="a cat", size="32x32"),
            "image",
        ),
        (
            lambda: client.images.generate(
                model="tiny-z_image", prompt="a cat", size="32x32", extra_body={"true_cfg_scale": 2.0}
            ),
            "true_cfg_scale",
        ),
    ]
    for call, field in cases:
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.body["param"] == field, err.value.body
