"""Wan VACE on /v1/videos over HTTP (tiny folder): the source video and its mask uploaded as MP4s
(``video_reference``, ``mask``), on /v1/videos/sync and as an async job. Each MP4 decodes to what our writer makes
of ``WanVACEPipeline``'s frames for the frames the server decoded from the uploads (H.264 is lossy but
deterministic; offline equality is exact, test_engine.py). A mask that does not fit its video is a 400 naming
``mask``, on both routes, before a job is made."""

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
from tests.models.wan_vace.conftest import clip, mask_clip
from tests.stages.diffusion.helpers import noise_image
from tests.video_http import decode_mp4

pytestmark = pytest.mark.slow  # a server, and diffusers' pipeline: 20 s or more

FIELDS = {"prompt": "a red cat", "size": "48x32", "num_frames": 9, "num_inference_steps": 2, "seed": 4, "fps": 16}


@pytest.fixture(scope="module")
def url(wan_vace_dir):
    srv = serve_engine(AsyncOmni(wan_vace_dir), served_model_name="tiny-wan-vace")
    yield srv.url
    srv.stop()


def _mp4(frames: list[Image.Image]) -> tuple[bytes, list[Image.Image]]:
    """An MP4 of ``frames`` and the frames the server decodes it to (PyAV), as PIL images."""
    data = encode_mp4(np.stack([np.asarray(f) for f in frames]), 16)
    return data, [Image.fromarray(f) for f in decode_mp4(data)["frames"]]


def _form(**extra) -> dict[str, str]:
    return {k: str(v) for k, v in {**FIELDS, **extra}.items()}


def test_video_and_mask_uploads_equal_the_pipeline(url, reference):
    video, video_frames = _mp4(clip(9, 32, 48, 60))
    mask, mask_frames = _mp4(mask_clip(9, 32, 48, 24))
    want = reference("a red cat", 4, height=32, width=48, num_frames=9, video=video_frames, mask=mask_frames)
    want = decode_mp4(encode_mp4(want, 16))["frames"]
    files = {"video_reference": ("clip.mp4", video, "video/mp4"), "mask": ("mask.mp4", mask, "video/mp4")}

    r = httpx.post(f"{url}/v1/videos/sync", data=_form(max_sequence_length=16), files=files, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4", r.text
    got = decode_mp4(r.content)
    assert got["frames"].shape == (9, 32, 48, 3) and got["fps"] == 16
    assert np.array_equal(got["frames"], want)

    with httpx.Client(base_url=url, timeout=60) as c:
        job = c.post("/v1/videos", data=_form(max_sequence_length=16), files=files).json()
        deadline = time.monotonic() + 120
        while job["status"] not in ("completed", "failed") and time.monotonic() < deadline:
            time.sleep(0.05)
            job = c.get(f"/v1/videos/{job['id']}").json()
        assert job["status"] == "completed", job
        assert np.array_equal(decode_mp4(c.get(f"/v1/videos/{job['id']}/content").content)["frames"], want)


def test_an_uploaded_reference_picture_equals_the_pipelines_reference_images(url, reference):
    """``input_reference`` (the route's reference picture) is the pipeline's ``reference_images``."""
    picture = noise_image(24, 40, 5)
    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    video, video_frames = _mp4(clip(9, 32, 48, 70))
    want = reference("a red cat", 4, height=32, width=48, num_frames=9, video=video_frames, reference_images=[picture])
    files = {
        "video_reference": ("clip.mp4", video, "video/mp4"),
        "input_reference": ("p.png", buf.getvalue(), "image/png"),
    }
    r = httpx.post(f"{url}/v1/videos/sync", data=_form(max_sequence_length=16), files=files, timeout=120)
    assert r.status_code == 200, r.text
    assert np.array_equal(decode_mp4(r.content)["frames"], decode_mp4(encode_mp4(want, 16))["frames"])


@pytest.mark.parametrize(
    "video,mask,why",
    [
        ((9, 32, 48), (5, 32, 48), "5 frames; the video has 9"),
        ((9, 32, 48), (9, 32, 32), "frames of 32x32; the video's are 48x32"),
        (None, (9, 32, 48), "needs the video"),
        ((9, 32, 48), b"\0" * 64, "not a decodable video"),
    ],
    ids=["frames", "size", "no-video", "broken"],
)
def test_a_mask_that_does_not_fit_is_a_400_naming_mask(url, video, mask, why):
    files = {"mask": ("mask.mp4", mask if isinstance(mask, bytes) else _mp4(mask_clip(*mask, 8))[0], "video/mp4")}
    if video is not None:
        files["video_reference"] = ("clip.mp4", _mp4(clip(*video, 0))[0], "video/mp4")
    jobs = httpx.get(f"{url}/v1/videos").json()["data"]
    for path in ("/v1/videos/sync", "/v1/videos"):
        r = httpx.post(f"{url}{path}", data=_form(), files=files, timeout=60)
        assert r.status_code == 400, (path, r.text)
        err = r.json()["error"]
        assert err["param"] == "mask" and why in err["message"], (path, err)
    assert httpx.get(f"{url}/v1/videos").json()["data"] == jobs  # no job was made of them
