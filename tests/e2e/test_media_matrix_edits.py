"""The image half of the media matrix through ``/v1/images/edits`` (the official openai client, multipart uploads
and ``image_url`` JSON) on the tiny FLUX.1 Kontext: every awkward image of tests/e2e/media_matrix.py (RGBA, LA,
palette, 16-bit, 1-bit, CMYK, EXIF-rotated, WebP, animated GIF / WebP) edits to exactly the image that
diffusers' ``load_image`` of it (EXIF orientation, first frame, ``convert("RGB")``) sent as a PNG edits to.
The server runs in this process (uvicorn in a thread)."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from omnistage import AsyncOmni
from omnistage.testing.server import serve_engine
from tests.e2e import media_matrix as mm

pytestmark = pytest.mark.slow

FAST = {"seed": 3, "num_inference_steps": 2, "guidance_scale": 3.0, "max_area": 48 * 32, "auto_resize": False}


@pytest.fixture(scope="module")
def kontext(tiny_model):
    folder = str(tiny_model("flux_kontext"))
    with serve_engine(AsyncOmni(folder), served_model_name="tiny-kontext") as srv:
        yield srv.url, openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=300)


def pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


def edit(client: openai.OpenAI, name: str, data: bytes, mime: str) -> np.ndarray:
    resp = client.images.edit(
        model="tiny-kontext", image=(name, data, mime), prompt="make it red", size="48x32", extra_body=FAST
    )
    return pixels(resp.data[0].b64_json)


def test_images_in_any_mode_edit_as_diffusers_load_image_of_them(kontext):
    url, client = kontext
    outputs = {}
    for name, make in mm.IMAGES.items():
        data = make()
        kind = name.split("_")[0]
        want = edit(client, "base.png", mm.model_form_image(data), "image/png")
        got = edit(client, f"in.{kind}", data, f"image/{kind}")
        assert np.array_equal(got, want), name
        outputs[name] = want
    assert len({o.tobytes() for o in outputs.values()}) == len(outputs)  # each input reaches the model


def test_an_image_url_takes_the_same_intake(kontext):
    url, _ = kontext
    data = mm.IMAGES["jpeg_exif_rotated"]()
    bodies = {
        "sent": "data:image/jpeg;base64," + base64.b64encode(data).decode(),
        "converted": "data:image/png;base64," + base64.b64encode(mm.model_form_image(data)).decode(),
    }
    out = {}
    for key, image_url in bodies.items():
        body = {"model": "tiny-kontext", "prompt": "make it red", "image_url": image_url, "size": "48x32", **FAST}
        resp = httpx.post(f"{url}/v1/images/edits", json=body, timeout=300)
        assert resp.status_code == 200, resp.text
        out[key] = pixels(resp.json()["data"][0]["b64_json"])
    assert np.array_equal(out["sent"], out["converted"])
