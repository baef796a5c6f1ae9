"""LTX-2 (video + audio from one stage) over HTTP and through ``omnistage generate``, on the tiny folders: one MP4
holding the H.264 video and an AAC soundtrack.

What "the right audio" means through a lossy codec: the MP4's audio stream has the model's rate and channel
count, lasts as long as the waveform (the stream's duration is samples / rate), decodes to exactly what our
own writer makes of diffusers' waveform for the same seed (FFmpeg's AAC encoder is deterministic), and stays
within AAC's tolerance of that raw waveform: at 128 kbit/s per channel every sample within 0.05 and the RMS
error under 5% of the signal's RMS (measured on this fixture: 0.025 and 1.7%; the tiny model's random-weight
waveform is broadband, the hard case for a perceptual codec, whose error grows with the signal's bandwidth).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

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

STG = {"spatio_temporal_guidance_blocks": [1]}  # the tiny DiT has 2 blocks (the release perturbs block 28)
BODY = {
    "prompt": "a red cat",
    "size": "64x32",
    "num_frames": 9,
    "fps": 25,
    "num_inference_steps": 3,
    "seed": 4,
    "guidance_scale": 3.0,
    "negative_prompt": "blurry",
    "max_sequence_length": 16,
    "extra_params": STG,
}
REF = dict(
    width=64,
    height=32,
    num_frames=9,
    frame_rate=25.0,
    num_inference_steps=3,
    guidance_scale=3.0,
    negative_prompt="blurry",
    max_sequence_length=16,
    output_type="np",
    **STG,
)


@pytest.fixture(scope="module")
def server(tiny_model):
    folder = tiny_model("ltx2")
    srv = serve_engine(AsyncOmni(str(folder)), served_model_name="tiny-ltx2")
    yield folder, srv.url
    srv.stop()


@pytest.fixture(scope="module")
def reference(server):
    """diffusers' frames (uint8, PIL rounding) and waveform [2, samples] for BODY."""
    torch.set_num_threads(1)
    out = reference_pipeline("LTX2Pipeline", str(server[0]))("a red cat", generator=gen(4), **REF)
    return (out.frames[0] * 255).round().astype(np.uint8), out.audio[0].float().numpy()


def assert_same_video(got: np.ndarray, want: np.ndarray) -> None:
    """Decoded H.264 frames of the same video, encoded by the same writer: equal to the last level (another seed is
    mean 21 levels away, max 132, on this fixture). The numerics are checked exactly in tests/models/ltx2."""
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.array_equal(got, want), np.abs(got.astype(int) - want.astype(int)).max()


def check_soundtrack(got: dict, frames: np.ndarray, wave: np.ndarray) -> None:
    assert got["frames"].shape == (9, 32, 64, 3) and got["fps"] == 25
    assert got["rate"] == 16000 and got["channels"] == 2
    assert got["duration"] == pytest.approx(wave.shape[1] / 16000, abs=1e-6)  # 0.33 s (the 9 frames last 0.36 s)
    # decodes to what our writer makes of diffusers' own outputs (H.264 and AAC are lossy but deterministic)
    want = decode_mp4(encode_mp4(frames, 25, wave, 16000))
    assert_same_video(got["frames"], want["frames"])
    assert np.abs(got["audio"] - want["audio"]).max() < 1e-3, np.abs(got["audio"] - want["audio"]).max()
    samples = got["audio"][:, : wave.shape[1]]  # the decoder pads the last 1024-sample AAC frame
    err = samples - wave
    assert np.abs(err).max() < 0.05
    assert np.sqrt((err**2).mean()) < 0.05 * np.sqrt((wave**2).mean())


def test_sync_mp4_holds_video_and_soundtrack(server, reference):
    _, url = server
    r = httpx.post(f"{url}/v1/videos/sync", json=BODY, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "video/mp4" and r.headers["x-model"] == "tiny-ltx2"
    check_soundtrack(decode_mp4(r.content), *reference)


def test_frame_count_is_taken_as_the_pipeline_takes_it(server):
    """LTX2Pipeline takes any count; the tiny VAE (temporal factor 2) decodes (8 - 1) // 2 * 2 + 1 = 7 frames
    of 8 (the offline frames against diffusers: tests/models/test_video_frame_counts.py)."""
    _, url = server
    r = httpx.post(f"{url}/v1/videos/sync", json={**BODY, "num_frames": 8}, timeout=120)
    assert r.status_code == 200, r.text
    assert decode_mp4(r.content)["frames"].shape[0] == 7


def test_async_job_reports_progress_and_serves_the_same_mp4(server, reference):
    _, url = server
    with httpx.Client(base_url=url, timeout=60) as c:
        job = c.post("/v1/videos", json=BODY).json()
        assert job["status"] == "queued", job
        seen, deadline = [], time.monotonic() + 120
        while True:
            state = c.get(f"/v1/videos/{job['id']}").json()
            seen.append(state["progress"])
            if state["status"] in ("completed", "failed") or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert state["status"] == "completed", state
        assert seen == sorted(seen) and seen[-1] == 100
        r = c.get(f"/v1/videos/{job['id']}/content")
        assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
        check_soundtrack(decode_mp4(r.content), *reference)


@pytest.mark.parametrize("modalities", [["video", "audio"], ["video"]])
def test_chat_returns_the_parts_asked_for(server, reference, modalities):
    import base64

    _, url = server
    body = {
        "model": "tiny-ltx2",
        "messages": [{"role": "user", "content": "a red cat"}],
        "modalities": modalities,
        **{k: v for k, v in BODY.items() if k not in ("prompt", "extra_params")},
        "extra_body": STG,
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    (part,) = [p for p in message["content"] if p["type"] == "video_url"]
    mp4 = decode_mp4(base64.b64decode(part["video_url"]["url"].split(",", 1)[1]))
    frames, wave = reference
    want = decode_mp4(encode_mp4(frames, 25))["frames"]
    assert mp4["frames"].shape == want.shape
    assert_same_video(mp4["frames"], want)  # the same video either way
    if modalities == ["video"]:
        assert mp4["audio"] is None and "audio" not in message  # no soundtrack decoded or sent
    else:
        check_soundtrack(mp4, frames, wave)
        assert message["audio"]["format"] == "wav" and message["audio"]["sample_rate"] == 16000


def test_generate_cli_writes_one_mp4_with_both_streams(server, reference, tmp_path):
    folder, _ = server
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    args = [
        str(folder),
        "--prompt",
        "a red cat",
        "--negative-prompt",
        "blurry",
        "--height",
        "32",
        "--width",
        "64",
        "--num-frames",
        "9",
        "--num-inference-steps",
        "3",
        "--seed",
        "4",
        "--guidance-scale",
        "3.0",
        "--extra-body",
        json.dumps({"fps": 25, "max_sequence_length": 16, **STG}),
        "--output",
        str(tmp_path / "out.mp4"),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "omnistage.cli.main", "generate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = done.stdout.split()
    check_soundtrack(decode_mp4(open(path, "rb").read()), *reference)
