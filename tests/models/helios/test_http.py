"""Helios image-to-video and video-to-video on /v1/videos over HTTP (tiny folder): a reference image uploaded as
``input_reference`` (through the official ``openai`` client's ``videos.create``, and on /v1/videos/sync), a source
video as ``video_reference``. Each MP4 decodes to what our writer makes of HeliosPipeline's frames for the same
image / decoded frames and seed (H.264 is lossy but deterministic; the frames themselves are checked exactly in
test_helios_inputs.py). Bad uploads are 400s naming the field."""

from __future__ import annotations

import io
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from omnistage import AsyncOmni
from omnistage.server.media import encode_mp4
from omnistage.testing.server import serve_engine
from tests.stages.diffusion.helpers import gen, noise_image, reference_pipeline
from tests.video_http import decode_mp4

pytestmark = pytest.mark.slow

FIELDS = {"prompt": "a red cat", "size": "32x32", "num_frames": 33, "num_inference_steps": 2, "seed": 4, "fps": 24}
REF = dict(height=32, width=32, num_frames=33, num_inference_steps=2, output_type="np")


@pytest.fixture(scope="module")
def server(tiny_model):
    folder = tiny_model("helios")
    srv = serve_engine(AsyncOmni(str(folder)), served_model_name="tiny-helios")
    yield folder, srv.url
    srv.stop()


@pytest.fixture(scope="module")
def ref(server):
    return reference_pipeline("HeliosPipeline", str(server[0]))


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _clip_mp4(frames: int, seed: int) -> tuple[bytes, list[Image.Image]]:
    """An MP4 of noise frames and the frames the server decodes it to (PyAV), as PIL images."""
    clip = np.stack([np.asarray(noise_image(32, 32, seed + i)) for i in range(frames)])
    mp4 = encode_mp4(clip, 24)
    return mp4, [Image.fromarray(f) for f in decode_mp4(mp4)["frames"]]


def _want_mp4(ref, **inputs) -> np.ndarray:
    out = ref("a red cat", generator=gen(4), **inputs, **REF)
    return decode_mp4(encode_mp4((out.frames[0] * 255).round().astype(np.uint8), 24))["frames"]


def _form() -> dict[str, str]:
    return {k: str(v) for k, v in FIELDS.items()}


def test_image_to_video_from_the_openai_client_and_sync(server, ref):
    from openai import OpenAI

    _, url = server
    image = noise_image(32, 32, 7)
    want = _want_mp4(ref, image=image)
    client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    job = client.videos.create(
        model="tiny-helios",
        prompt="a red cat",
        size="32x32",
        input_reference=("frame.png", _png(image), "image/png"),
        extra_body={k: v for k, v in _form().items() if k not in ("prompt", "size")},
    )
    deadline = time.monotonic() + 120
    while job.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.05)
        job = client.videos.retrieve(job.id)
    assert job.status == "completed", job
    got = decode_mp4(client.videos.download_content(job.id).content)["frames"]
    assert got.shape == (33, 32, 32, 3) and np.array_equal(got, want)

    files = {"input_reference": ("frame.png", _png(image), "image/png")}
    r = httpx.post(f"{url}/v1/videos/sync", data=_form(), files=files, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4", r.text
    assert np.array_equal(decode_mp4(r.content)["frames"], want)


def test_video_to_video_on_sync(server, ref):
    _, url = server
    mp4, frames = _clip_mp4(33, 20)
    want = _want_mp4(ref, video=frames)
    files = {"video_reference": ("clip.mp4", mp4, "video/mp4")}
    r = httpx.post(f"{url}/v1/videos/sync", data=_form(), files=files, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4", r.text
    got = decode_mp4(r.content)["frames"]
    assert got.shape == (33, 32, 32, 3) and np.array_equal(got, want)


@pytest.mark.parametrize(
    "files,param",
    [
        ({"input_reference": ("frame.png", b"\0" * 64, "image/png")}, "input_reference"),
        ({"video_reference": ("clip.mp4", b"\0" * 64, "video/mp4")}, "video_reference"),
        ({"video_reference": ("clip.mp4", None, "video/mp4")}, "video_reference"),  # 9 frames: under one chunk
        ({"picture": ("frame.png", None, "image/png")}, "picture"),  # not a field of the route
        (
            {"input_reference": ("frame.png", None, "image/png"), "video_reference": ("clip.mp4", None, "video/mp4")},
            "video_reference",  # an image or a video, not both
        ),
    ],
    ids=["broken-image", "broken-video", "short-video", "unknown-field", "image-and-video"],
)
def test_bad_uploads_are_400_naming_the_field(server, files, param):
    _, url = server
    made = {"image/png": _png(noise_image(32, 32, 1)), "video/mp4": _clip_mp4(9, 0)[0]}
    files = {k: (name, data if data is not None else made[mime], mime) for k, (name, data, mime) in files.items()}
    for path in ("/v1/videos/sync", "/v1/videos"):
        r = httpx.post(f"{url}{path}", data=_form(), files=files, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)
