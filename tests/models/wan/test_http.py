"""`omnistage serve` on the tiny Wan folder: /v1/videos/sync returns an MP4 of the requested frames and size,
and an async /v1/videos job reports progress, completes, and serves the same kind of MP4; a request the family
refuses is the same 400 on both, before a job is made."""

from __future__ import annotations

import io
import time

import httpx
import numpy as np
import pytest

from omnistage.server.media import encode_mp4
from omnistage.testing.server import ServeProcess
from tests.stages.diffusion.helpers import gen, reference_pipeline

pytestmark = pytest.mark.slow  # a real server process: imports and start-up take ~20 s


@pytest.fixture(scope="module")
def wan_server(tiny_model, tmp_path_factory):
    folder = tiny_model("wan")
    log = tmp_path_factory.mktemp("wanlog") / "server.log"
    server = ServeProcess.launch([str(folder), "--served-model-name", "tiny-wan"], log)
    yield folder, server.url
    server.stop()


def mp4_frames(data: bytes) -> tuple[np.ndarray, float]:
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
        return frames, float(stream.average_rate)


def test_sync_video_is_an_mp4_of_the_requested_shape(wan_server):
    folder, url = wan_server
    body = {
        "prompt": "a red cat",
        "size": "48x32",
        "num_frames": 9,
        "num_inference_steps": 3,
        "seed": 4,
        "fps": 8,
        "guidance_scale": 4.0,
        "negative_prompt": "blurry",
    }
    r = httpx.post(f"{url}/v1/videos/sync", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "video/mp4" and r.headers["x-model"] == "tiny-wan"
    assert float(r.headers["x-inference-time-s"]) > 0
    frames, fps = mp4_frames(r.content)
    assert frames.shape == (9, 32, 48, 3) and fps == 8

    # H.264 is lossy but deterministic: the served video decodes to what diffusers' frames for this seed encode to
    ref = reference_pipeline("WanPipeline", str(folder))
    kw = dict(height=32, width=48, num_frames=9, num_inference_steps=3, guidance_scale=4.0, negative_prompt="blurry")
    want = (ref("a red cat", generator=gen(4), **kw).frames[0] * 255).round().astype(np.uint8)
    assert np.array_equal(frames, mp4_frames(encode_mp4(want, 8))[0])

    # what the family refuses (its stage checks it) is the same 400 for a job as for /sync, and no job is made
    jobs = httpx.get(f"{url}/v1/videos").json()["data"]
    for bad, param, why in (
        ({"num_frames": 129}, "num_frames", "exceeds"),  # past the tiny DiT's rotary table (diffusers fails there)
        ({"size": "40x32"}, "size", "not divisible by"),  # the field sent (its width is what the stage checks)
    ):
        for path in ("/v1/videos/sync", "/v1/videos"):
            r = httpx.post(f"{url}{path}", json={**body, **bad}, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)
            assert why in r.json()["error"]["message"]
    assert httpx.get(f"{url}/v1/videos").json()["data"] == jobs


def test_async_job_reports_progress_and_completes(wan_server):
    _, url = wan_server
    with httpx.Client(base_url=url, timeout=60) as c:
        form = {"prompt": "green square", "size": "64x64", "num_frames": "9", "num_inference_steps": "40", "seed": "1"}
        job = c.post("/v1/videos", files={k: (None, v) for k, v in form.items()}).json()  # multipart form
        assert job["status"] == "queued" and job["object"] == "video" and job["model"] == "tiny-wan"
        seen, deadline = [], time.monotonic() + 120
        while True:
            state = c.get(f"/v1/videos/{job['id']}").json()
            seen.append((state["status"], state["progress"]))
            if state["status"] in ("completed", "failed") or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert state["status"] == "completed" and state["progress"] == 100, state
        assert any(s == "in_progress" and 0 < p < 100 for s, p in seen), seen
        progress = [p for _, p in seen]
        assert progress == sorted(progress)
        r = c.get(f"/v1/videos/{job['id']}/content")
        assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
        frames, fps = mp4_frames(r.content)
        assert frames.shape == (9, 64, 64, 3) and fps == 16  # the family's default fps
        assert c.delete(f"/v1/videos/{job['id']}").json()["deleted"] is True
        assert c.get(f"/v1/videos/{job['id']}").status_code == 404


def test_a_mask_upload_is_refused_naming_it(wan_server):
    """Wan takes no mask video (Wan VACE does): the upload is a 400 naming ``mask``, before any decoding."""
    _, url = wan_server
    form = {"prompt": "a red cat", "size": "48x32", "num_frames": "9"}
    r = httpx.post(f"{url}/v1/videos/sync", data=form, files={"mask": ("m.mp4", b"\0" * 64, "video/mp4")}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "mask", r.text
