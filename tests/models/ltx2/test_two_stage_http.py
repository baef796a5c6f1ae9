"""The two-stage LTX-2 deploy over HTTP: ``POST /v1/videos`` (an async job), its MP4 decoded with PyAV against what
our writer makes of diffusers' two-stage recipe (``two_stage_recipe.py``), as ``test_http.py`` compares the one-stage
family; bad input a 400 naming the field. The refine stage runs in its own process (``process: mp``), so the first
pass's latents and generator state cross between processes, as they do when the stages sit on two devices."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest

from omnistage import AsyncOmni
from omnistage.server.media import encode_mp4
from omnistage.testing.server import serve_engine
from tests.models.ltx2.test_http import assert_same_video
from tests.models.ltx2.two_stage_recipe import FIRST, FPS, NEGATIVE, PROMPT, SEED, STG, run_recipe
from tests.video_http import decode_mp4

pytestmark = pytest.mark.slow

BODY = {
    "prompt": PROMPT,
    "negative_prompt": NEGATIVE,
    "size": "64x64",
    "fps": FPS,
    "seed": SEED,
    **FIRST,
    "extra_params": STG,
}


@pytest.fixture(scope="module")
def server(tiny_model):
    folder = tiny_model("ltx2")
    engine = AsyncOmni(str(folder), pipeline="ltx2_two_stage", stage_overrides={"1": {"process": "mp"}})
    # the refine stage's process imports torch and diffusers and loads its own copy of the weights: under a loaded
    # machine more than serve_engine's default minute
    srv = serve_engine(engine, ready_timeout=300, served_model_name="tiny-ltx2-two-stage")
    yield folder, srv.url
    srv.stop()


def test_video_job_equals_the_recipe(server):
    folder, url = server
    with httpx.Client(base_url=url, timeout=60) as c:
        job = c.post("/v1/videos", json=BODY)
        assert job.status_code == 200, job.text
        job_id, deadline = job.json()["id"], time.monotonic() + 180
        while (state := c.get(f"/v1/videos/{job_id}").json())["status"] not in ("completed", "failed"):
            assert time.monotonic() < deadline, state
            time.sleep(0.05)
        assert state["status"] == "completed", state
        r = c.get(f"/v1/videos/{job_id}/content")
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
    got = decode_mp4(r.content)
    frames, wave = run_recipe(folder)
    assert got["frames"].shape == (5, 64, 64, 3) and got["fps"] == FPS
    assert got["rate"] == 16000 and got["channels"] == 2
    # H.264 and AAC are lossy but deterministic: the same bytes as our writer makes of the recipe's outputs
    want = decode_mp4(encode_mp4(frames, FPS, wave, 16000))
    assert_same_video(got["frames"], want["frames"])
    assert np.abs(got["audio"] - want["audio"]).max() < 1e-3


@pytest.mark.parametrize(
    "change, param",
    [
        ({"size": "96x64"}, "size"),  # the first pass would draw 48 wide: not a multiple of 32
        ({"extra_params": {"motion_speed": -1}}, "motion_speed"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, change, param):
    _, url = server
    r = httpx.post(f"{url}/v1/videos", json={**BODY, **change}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
