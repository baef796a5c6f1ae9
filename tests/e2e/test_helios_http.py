"""Helios over HTTP on the tiny folder: /v1/videos/sync returns an MP4 of the requested frames (two chunks), fps and
size that decodes to what diffusers' frames for the same seed encode to; a frame count Helios cannot make is a 400
before any work."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from omnistage import AsyncOmni
from omnistage.server.media import encode_mp4
from omnistage.testing.server import serve_engine
from tests.e2e.test_ltx2_http import decode_mp4
from tests.stages.diffusion.helpers import gen, reference_pipeline

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_model):
    folder = tiny_model("helios")
    srv = serve_engine(AsyncOmni(str(folder)), served_model_name="tiny-helios")
    yield folder, srv.url
    srv.stop()


def test_sync_mp4_and_bad_frame_count(server):
    folder, url = server
    body = {"prompt": "a red cat", "size": "48x32", "num_frames": 65, "fps": 12, "num_inference_steps": 2, "seed": 4}
    r = httpx.post(f"{url}/v1/videos/sync", json=body, timeout=120)
    assert r.status_code == 200, r.text
    got = decode_mp4(r.content)
    assert got["frames"].shape == (65, 32, 48, 3) and got["fps"] == 12 and got["audio"] is None
    torch.set_num_threads(1)
    ref = reference_pipeline("HeliosPipeline", str(folder))  # guidance_scale: its default 5.0, the family's too
    want = (ref("a red cat", generator=gen(4), height=32, width=48, num_frames=65, num_inference_steps=2,
                output_type="np").frames[0] * 255).round().astype(np.uint8)
    assert np.array_equal(got["frames"], decode_mp4(encode_mp4(want, 12))["frames"])

    r = httpx.post(f"{url}/v1/videos/sync", json={**body, "num_frames": 64}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "num_frames", r.text
    assert "65" in r.json()["error"]["message"]
