"""vLLM-Omni's diffusion clients against omnistage, unchanged but for the URL and the model name.

Re-created from the request shapes of vLLM-Omni's ``examples/online_serving/text_to_image`` and
``image_to_image`` (a chat request whose generation keys travel in a literal ``extra_body`` JSON key, the answer
read from ``choices[0].message.content[0].image_url.url``), their curl scripts (curl | jq | base64 -d) and the
requests of its diffusion serving benchmark (``model: "default"``, a 1-step warm-up, /v1/images/generations,
multipart /v1/images/edits and /v1/videos with polling). Each test decodes what it gets (PIL, PyAV) and holds it
equal to the same request written plainly for omnistage. The deliberate differences are in
docs/compatibility.md.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from omnistage import AsyncOmni
from omnistage.server.prompt_warnings import HEADER
from omnistage.testing.requires import requires_tool
from omnistage.testing.server import serve_engine
from tests.stages.diffusion.helpers import noise_image
from tests.video_http import decode_mp4

pytestmark = pytest.mark.slow

T2I_SEED, STEPS = 42, 2  # the clients' seed; steps cut for a CPU run (the clients send 50 / 100)


def _serve(tiny_model, name: str):
    # one served name: the benchmark's model "default" is answered as the one model a server serves
    return serve_engine(AsyncOmni(str(tiny_model(name))), served_model_name=f"tiny-{name}")


@pytest.fixture(scope="module")
def t2i(tiny_model):
    srv = _serve(tiny_model, "qwen_image")
    yield srv.url
    srv.stop()


@pytest.fixture(scope="module")
def i2i(tiny_model):
    srv = _serve(tiny_model, "qwen_image_edit")
    yield srv.url
    srv.stop()


@pytest.fixture(scope="module")
def video(tiny_model):
    srv = _serve(tiny_model, "wan")
    yield srv.url
    srv.stop()


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def chat_images(resp: httpx.Response) -> list[np.ndarray]:
    """The images of a chat answer, read as the clients read them (content parts with data URLs)."""
    assert resp.status_code == 200, resp.text
    content = resp.json()["choices"][0]["message"]["content"]
    return [pixels(base64.b64decode(part["image_url"]["url"].split(",", 1)[1])) for part in content]


def plain_images(url: str, **body) -> list[np.ndarray]:
    r = httpx.post(f"{url}/v1/images/generations", json={"prompt": "a cup of coffee on the table", **body}, timeout=300)
    assert r.status_code == 200, r.text
    return [pixels(base64.b64decode(d["b64_json"])) for d in r.json()["data"]]


def assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def plain_video(url: str, **body) -> np.ndarray:
    """The frames of the same video asked for plainly (JSON, num_frames), decoded."""
    body = {"prompt": "a red cat", "size": "48x32", "num_inference_steps": STEPS, **body}
    r = httpx.post(f"{url}/v1/videos/sync", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return decode_mp4(r.content)["frames"]


# ------------------------------------------------------------------ text to image (chat client and curl script)


@pytest.mark.parametrize("outputs", [1, 2])
def test_text_to_image_chat_client(t2i, outputs):
    # its defaults: true_cfg_scale 4.0 and no negative prompt, num_outputs_per_prompt always sent, no model
    extra_body = {
        "height": 32,
        "width": 48,
        "num_inference_steps": STEPS,
        "true_cfg_scale": 4.0,
        "seed": T2I_SEED,
        "num_outputs_per_prompt": outputs,
    }
    payload = {"messages": [{"role": "user", "content": "a cup of coffee on the table"}], "extra_body": extra_body}
    r = httpx.post(
        f"{t2i}/v1/chat/completions", headers={"Content-Type": "application/json"}, json=payload, timeout=300
    )
    got = chat_images(r)
    # diffusers' rule: no negative prompt, no true CFG; said in a warning
    assert any("true_cfg_scale=4" in w for w in r.headers.get_list(HEADER)), r.headers
    assert any("true_cfg_scale=4" in w for w in r.json()["warnings"])
    want = plain_images(t2i, size="48x32", num_inference_steps=STEPS, seed=T2I_SEED, n=outputs)
    assert len(got) == outputs
    assert_same(got, want)


@requires_tool("curl", "jq")
def test_text_to_image_curl_script(t2i, tmp_path):
    out = tmp_path / "out.png"
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "a cup of coffee on the table"}],
            "extra_body": {
                "height": 32,
                "width": 48,
                "num_inference_steps": STEPS,
                "true_cfg_scale": 4.0,
                "seed": T2I_SEED,
                "num_outputs_per_prompt": 1,
            },
        }
    )
    script = (
        f'curl -s "$SERVER/v1/chat/completions" -H "Content-Type: application/json" -d "$BODY" '
        "| jq -r '.choices[0].message.content[0].image_url.url' | sed 's/^data:image[^,]*,\\s*//' "
        f'| base64 -d > "{out}"'
    )
    subprocess.run(["bash", "-c", script], env={"SERVER": t2i, "BODY": body, "PATH": os.environ["PATH"]}, check=True)
    assert_same([pixels(out.read_bytes())], plain_images(t2i, size="48x32", num_inference_steps=STEPS, seed=T2I_SEED))


# ------------------------------------------------------------------ image to image (chat client and curl)


def test_image_to_image_chat_client(i2i):
    source = png(noise_image(32, 32, 1))
    content = [
        {"type": "text", "text": "Convert this image to watercolor style"},
        {"type": "image_url", "image_url": {"url": data_url(source)}},
    ]
    # its defaults: guidance_scale 7.5 (Qwen-Image-Edit ignores it, as diffusers does), height / width
    extra_body = {"height": 64, "width": 64, "num_inference_steps": STEPS, "guidance_scale": 7.5, "seed": 42}
    payload = {"messages": [{"role": "user", "content": content}], "extra_body": extra_body}
    got = chat_images(httpx.post(f"{i2i}/v1/chat/completions", json=payload, timeout=300))
    plain = httpx.post(
        f"{i2i}/v1/images/edits",
        data={
            "prompt": "Convert this image to watercolor style",
            "size": "64x64",
            "num_inference_steps": STEPS,
            "seed": 42,
        },
        files={"image": ("in.png", source, "image/png")},
        timeout=300,
    )
    assert plain.status_code == 200, plain.text
    assert_same(got, [pixels(base64.b64decode(d["b64_json"])) for d in plain.json()["data"]])


# ------------------------------------------------------------------ the diffusion serving benchmark's requests


def test_benchmark_warm_up_says_which_step_counts_work(t2i):
    # its warm-up: one request at num_inference_steps=1, as a chat request to model "default"
    payload = {
        "model": "default",
        "messages": [{"role": "user", "content": "A cat sitting on a bench"}],
        "extra_body": {"height": 32, "width": 48, "num_inference_steps": 1, "seed": 0},
    }
    r = httpx.post(f"{t2i}/v1/chat/completions", json=payload, timeout=300)
    # Qwen-Image's scheduler (shift_terminal) has no 1-step schedule: diffusers returns NaN, omnistage says so
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "num_inference_steps" and "send num_inference_steps 2 or more" in err["message"]
    # and what it says to send works
    payload["extra_body"]["num_inference_steps"] = 2
    assert httpx.post(f"{t2i}/v1/chat/completions", json=payload, timeout=300).status_code == 200


def test_benchmark_warm_up_on_an_edit_model_says_which_step_counts_work(i2i):
    form = {"model": "default", "prompt": "make it red", "size": "32x32", "num_inference_steps": "1", "seed": "0"}
    image = {"image": ("a.png", png(noise_image(32, 32, 2)), "image/png")}
    r = httpx.post(f"{i2i}/v1/images/edits", data=form, files=image, timeout=300)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "num_inference_steps" and "send num_inference_steps 2 or more" in err["message"]


def test_benchmark_chat_request(t2i):
    payload = {
        "model": "default",
        "messages": [{"role": "user", "content": "a cup of coffee on the table"}],
        "extra_body": {"height": 32, "width": 48, "num_inference_steps": STEPS, "seed": 0},
    }
    got = chat_images(httpx.post(f"{t2i}/v1/chat/completions", json=payload, timeout=300))
    assert_same(got, plain_images(t2i, size="48x32", num_inference_steps=STEPS, seed=0))


def test_benchmark_images_generations_request(t2i):
    payload = {
        "model": "default",
        "prompt": "a cup of coffee on the table",
        "n": 1,
        "size": "48x32",
        "response_format": "b64_json",
        "seed": 0,
        "num_inference_steps": STEPS,
    }
    headers = {"Content-Type": "application/json", "Authorization": "Bearer EMPTY"}
    r = httpx.post(f"{t2i}/v1/images/generations", json=payload, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    got = [pixels(base64.b64decode(d["b64_json"])) for d in r.json()["data"]]
    assert_same(got, plain_images(t2i, size="48x32", num_inference_steps=STEPS, seed=0))


def test_benchmark_images_edits_request(i2i):
    source = png(noise_image(32, 32, 2))
    # multipart with its default ``bot_task`` field (a key of other models: ignored, with a warning)
    form = {
        "model": "default",
        "prompt": "make it red",
        "size": "64x64",
        "response_format": "b64_json",
        "num_inference_steps": str(STEPS),
        "seed": "3",
        "bot_task": "think",
    }
    r = httpx.post(f"{i2i}/v1/images/edits", data=form, files={"image": ("a.png", source, "image/png")}, timeout=300)
    assert r.status_code == 200, r.text
    assert any("bot_task" in w for w in r.headers.get_list(HEADER))
    plain = httpx.post(
        f"{i2i}/v1/images/edits",
        data={"prompt": "make it red", "size": "64x64", "num_inference_steps": str(STEPS), "seed": "3"},
        files={"image": ("a.png", source, "image/png")},
        timeout=300,
    )
    assert plain.status_code == 200, plain.text
    assert_same(
        [pixels(base64.b64decode(d["b64_json"])) for d in r.json()["data"]],
        [pixels(base64.b64decode(d["b64_json"])) for d in plain.json()["data"]],
    )


def test_benchmark_videos_request_with_polling(video):
    # multipart: height / width / num_frames / fps as separate fields, then GET /v1/videos/{id} until done
    form = {
        "model": "default",
        "prompt": "a red cat",
        "height": "32",
        "width": "48",
        "num_frames": "9",
        "num_inference_steps": str(STEPS),
        "seed": "1",
        "fps": "8",
    }
    r = httpx.post(f"{video}/v1/videos", data=form, timeout=300)
    assert r.status_code == 200, r.text
    job = r.json()
    deadline = time.monotonic() + 300  # stops a hang; not a timing assertion
    while job["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
        job = httpx.get(f"{video}/v1/videos/{job['id']}", timeout=30).json()
    assert job["status"] == "completed", job
    content = httpx.get(f"{video}/v1/videos/{job['id']}/content", timeout=60)
    assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
    got = decode_mp4(content.content)
    assert got["frames"].shape == (9, 32, 48, 3) and got["fps"] == 8
    np.testing.assert_array_equal(got["frames"], plain_video(video, num_frames=9, seed=1, fps=8))
    assert job["warnings"] is None  # every field it sent was used


# ------------------------------------------------------------------ documented video requests


def test_seconds_and_fps_take_the_nearest_frame_count(video):
    body = {"prompt": "a red cat", "size": "48x32", "num_inference_steps": STEPS, "seed": 2}
    # 1 s x 8 fps = 8 frames; Wan makes 4k+1 counts: 9, the video a plain 9-frame request gives (the MP4 writer
    # gives the same bytes for the same frames: tests/server/test_mp4_repeatable.py)
    nine = plain_video(video, num_frames=9, seed=2, fps=8)
    r = httpx.post(f"{video}/v1/videos/sync", json={**body, "seconds": 1, "fps": 8}, timeout=300)
    assert r.status_code == 200, r.text
    assert any("8 frames" in w and "nearest, 9" in w for w in r.headers.get_list(HEADER))
    got = decode_mp4(r.content)
    assert got["frames"].shape == (9, 32, 48, 3) and got["fps"] == 8
    np.testing.assert_array_equal(got["frames"], nine)
    # the async job says it too
    job = httpx.post(f"{video}/v1/videos", json={**body, "seconds": 1, "fps": 8}, timeout=300).json()
    deadline = time.monotonic() + 300  # stops a hang; not a timing assertion
    while job["status"] not in ("completed", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
        job = httpx.get(f"{video}/v1/videos/{job['id']}", timeout=30).json()
    assert job["status"] == "completed" and any("nearest, 9" in w for w in job["warnings"])
    content = httpx.get(f"{video}/v1/videos/{job['id']}/content", timeout=60)
    assert content.status_code == 200, content.text
    np.testing.assert_array_equal(decode_mp4(content.content)["frames"], nine)
    # docs/server.md's example: 2 s x 16 fps = 32 frames -> 33, said in a warning
    r = httpx.post(f"{video}/v1/videos/sync", json={**body, "seconds": 2, "fps": 16}, timeout=300)
    assert r.status_code == 200, r.text
    [warning] = r.headers.get_list(HEADER)
    assert "32 frames" in warning and "nearest, 33" in warning
    got = decode_mp4(r.content)
    assert got["frames"].shape == (33, 32, 48, 3) and got["fps"] == 16
    np.testing.assert_array_equal(got["frames"], plain_video(video, num_frames=33, seed=2, fps=16))


@pytest.mark.parametrize(
    "body, files, param",
    [
        ({"size": "40x32", "num_frames": "9"}, None, "size"),  # the width the size gives is not a multiple of 16
        ({"size": "48x32", "num_frames": "129"}, None, "num_frames"),  # past the tiny DiT's rotary table: named so
        ({"size": "48x32", "seconds": "600", "fps": "24"}, None, "seconds"),  # beyond the model's frames
        ({"size": "48x32", "num_frames": "9"}, {"input_reference": ("a.png", b"", "image/png")}, "input_reference"),
    ],
)
def test_video_errors_name_the_field_sent(video, body, files, param):
    if files is not None:  # a text-to-video checkpoint given a first frame
        files = {"input_reference": ("a.png", png(noise_image(32, 48, 0)), "image/png")}
    form = {"prompt": "a red cat", "num_inference_steps": "1", **body}
    for route in ("/v1/videos/sync", "/v1/videos"):
        r = httpx.post(f"{video}{route}", data=form, files=files, timeout=300)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.json()
