"""Video families over HTTP on their tiny folders (one row each): /v1/videos/sync returns an MP4 of the requested
frames, fps and size that decodes to what diffusers' frames for the same seed encode to; a frame count the model's
pipeline rounds is answered with the frames the pipeline makes for it. (LTX-2, with its audio track, and Wan have
their own modules.)"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import torch

from omnistage import AsyncOmni
from omnistage.server.media import encode_mp4
from omnistage.testing.server import serve_engine
from tests.stages.diffusion.helpers import gen, reference_pipeline
from tests.video_http import decode_mp4

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class VideoFamily:
    name: str
    reference: str  # diffusers' pipeline class; its default guidance is the family's too
    width: int
    height: int
    frames: int
    rounded: int  # a count the pipeline takes and makes ``frames`` of


FAMILIES = [
    # its guider: the folder's scale, 6.0; its tiny VAE's temporal factor 2 decodes (6 - 1) // 2 * 2 + 1 = 5 frames
    VideoFamily("hunyuan_video15", "HunyuanVideo15Pipeline", 32, 16, 5, 6),
    VideoFamily("helios", "HeliosPipeline", 48, 32, 65, 64),  # 65 frames: two chunks of 33, trimmed to 4k+1
]


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def server(request, tiny_model):
    fam = request.param
    folder = tiny_model(fam.name)
    srv = serve_engine(AsyncOmni(str(folder)), served_model_name=f"tiny-{fam.name}")
    yield fam, folder, srv.url
    srv.stop()


def test_sync_mp4_and_rounded_frame_count(server):
    fam, folder, url = server
    body = {
        "prompt": "a red cat",
        "size": f"{fam.width}x{fam.height}",
        "num_frames": fam.frames,
        "fps": 12,
        "num_inference_steps": 2,
        "seed": 4,
    }
    r = httpx.post(f"{url}/v1/videos/sync", json=body, timeout=120)
    assert r.status_code == 200, r.text
    got = decode_mp4(r.content)
    assert got["frames"].shape == (fam.frames, fam.height, fam.width, 3) and got["fps"] == 12 and got["audio"] is None
    torch.set_num_threads(1)
    ref = reference_pipeline(fam.reference, str(folder))
    want = (
        (
            ref(
                "a red cat",
                generator=gen(4),
                height=fam.height,
                width=fam.width,
                num_frames=fam.frames,
                num_inference_steps=2,
                output_type="np",
            ).frames[0]
            * 255
        )
        .round()
        .astype(np.uint8)
    )
    # the same frames encoded by the same writer: exactly the same video (the numerics against diffusers are
    # tested in tests/models/helios; another seed is mean 4.7 levels away, max 75)
    want_mp4 = decode_mp4(encode_mp4(want, 12))["frames"]
    assert got["frames"].shape == want_mp4.shape
    assert np.array_equal(got["frames"], want_mp4), np.abs(got["frames"].astype(int) - want_mp4.astype(int)).max()

    # the pipeline makes the same video of the rounded count (the same latents): so does the server
    r = httpx.post(f"{url}/v1/videos/sync", json={**body, "num_frames": fam.rounded}, timeout=120)
    assert r.status_code == 200, r.text
    assert np.array_equal(decode_mp4(r.content)["frames"], got["frames"])
