"""``n`` on /v1/images/edits counts the images returned, as OpenAI's does, also for a family that edits each input
image on its own (SD3 img2img: diffusers' image batch, outputs = inputs x per prompt): two images and n=2 give
two images, no n gives one edit of each, and n=1 with two images is a 400 naming ``n`` (it cannot be honoured)
instead of two images."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from omnistage import AsyncOmni
from omnistage.testing.server import serve_engine
from tests.stages.diffusion.helpers import noise_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(tiny_model):
    srv = serve_engine(AsyncOmni(str(tiny_model("sd3"))), served_model_name="tiny-sd3")
    yield srv.url
    srv.stop()


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def edit(url: str, images: int, **fields) -> httpx.Response:
    files = [("image", (f"{i}.png", _png(noise_image(32, 48, i)), "image/png")) for i in range(images)]
    form = {"prompt": "make it winter", "size": "48x32", "strength": "0.6", "num_inference_steps": "2", "seed": "5"}
    return httpx.post(f"{url}/v1/images/edits", data={**form, **fields}, files=files, timeout=300)


def decoded(r: httpx.Response) -> list[np.ndarray]:
    assert r.status_code == 200, r.text
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(d["b64_json"]))).convert("RGB")) for d in r.json()["data"]
    ]


def test_n_counts_the_images_returned(url):
    each = decoded(edit(url, 2))  # no n: one edit of each input
    assert len(each) == 2
    two = decoded(edit(url, 2, n="2"))  # n=2 from 2 inputs: one each, the same request
    assert len(two) == 2
    for a, b in zip(each, two):
        np.testing.assert_array_equal(a, b)
    assert len(decoded(edit(url, 2, n="4"))) == 4
    assert len(decoded(edit(url, 1, n="2"))) == 2
    r = edit(url, 2, n="1")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "n" and "multiple of 2" in r.json()["error"]["message"]
