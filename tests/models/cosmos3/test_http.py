"""cosmos3 over HTTP on the tiny folder: images through the official ``openai`` client, videos as MP4 (decoded with
PyAV; a video with sound carries an AAC track), and a policy's actions as JSON on /v1/videos jobs, /v1/videos/sync
(``Accept: application/json``) and chat. Every answer is checked against Cosmos3OmniPipeline's for the same seed;
the numerics are checked exactly in the engine tests, here H.264 / AAC decode to what our own writer makes of
diffusers' outputs (both codecs are lossy but deterministic)."""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from omnistage import AsyncOmni
from omnistage.server.media import encode_mp4
from omnistage.testing.server import serve_engine
from tests.stages.diffusion.helpers import gen, reference_pipeline

pytestmark = pytest.mark.slow  # a server and the reference: ~30 s

STEPS = {"num_inference_steps": 3, "guidance_scale": 6.0}
POLICY = {"task": "policy", "action_domain": "av", "action_chunk_size": 4, "resolution_tier": 256}


@pytest.fixture(scope="module")
def server(tiny_model):
    folder = tiny_model("cosmos3")
    srv = serve_engine(AsyncOmni(str(folder)), served_model_name="tiny-cosmos3")
    yield folder, srv.url
    srv.stop()


@pytest.fixture(scope="module")
def ref(server):
    return reference_pipeline("Cosmos3OmniPipeline", str(server[0]))


def _uint8(frames) -> np.ndarray:
    return (np.asarray(frames) * 255).round().astype(np.uint8)


def _frame() -> Image.Image:
    return Image.fromarray(np.random.default_rng(3).integers(0, 255, (32, 48, 3), dtype=np.uint8))


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def decode_mp4(data: bytes) -> dict:
    import av

    with av.open(io.BytesIO(data)) as c:
        v = c.streams.video[0]
        out = {"frames": np.stack([f.to_ndarray(format="rgb24") for f in c.decode(v)]), "audio": None}
        if c.streams.audio:
            a = c.streams.audio[0]
            out.update(rate=a.rate, channels=a.channels)
            c.seek(0)
            out["audio"] = np.concatenate([f.to_ndarray() for f in c.decode(a)], axis=1)
    return out


def _policy_reference(ref):
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    cond = CosmosActionCondition(mode="policy", chunk_size=4, domain_name="av", resolution_tier=256, image=_frame())
    return ref("pick up the cup", action=cond, generator=gen(6), output_type="np", **STEPS)


def _check_actions(answer: dict, expected) -> None:
    assert answer["action_domain"] == "av" and answer["action_fps"] == 24
    got = torch.tensor(answer["actions"], dtype=torch.float32)  # JSON floats hold every float32 exactly
    assert got.shape == (4, 9) and torch.equal(got, expected.action[0])


def test_openai_images_equal_diffusers(server, ref):
    from openai import OpenAI

    _, url = server
    client = OpenAI(base_url=f"{url}/v1", api_key="x")
    r = client.images.generate(
        model="tiny-cosmos3",
        prompt="a red cat",
        size="32x32",
        response_format="b64_json",
        extra_body={**STEPS, "seed": 5},
    )
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(r.data[0].b64_json))).convert("RGB"))
    want = _uint8(
        ref("a red cat", num_frames=1, height=32, width=32, generator=gen(5), output_type="np", **STEPS).video
    )
    assert np.array_equal(got, want[0])


def test_sync_video_with_sound_is_one_mp4(server, ref):
    _, url = server
    body = {
        "prompt": "waves",
        "size": "48x32",
        "num_frames": 9,
        "seed": 7,
        **STEPS,
        "extra_params": {"enable_sound": True},
    }
    r = httpx.post(f"{url}/v1/videos/sync", json=body, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4", r.text
    got = decode_mp4(r.content)
    out = ref(
        "waves", num_frames=9, height=32, width=48, enable_sound=True, generator=gen(7), output_type="np", **STEPS
    )
    want = decode_mp4(encode_mp4(_uint8(out.video), 24, out.sound.float().numpy(), 16000))
    assert got["frames"].shape == (9, 32, 48, 3) and np.array_equal(got["frames"], want["frames"])
    assert got["rate"] == 16000 and got["channels"] == 2
    # the server's sound is diffusers' to the bit, so its AAC bitstream and FFmpeg's decode of it are the same
    assert got["audio"].shape == want["audio"].shape and np.array_equal(got["audio"], want["audio"])
    assert np.abs(want["audio"]).max() > 0.01  # a sound, not silence


def test_policy_actions_on_sync_and_jobs(server, ref):
    _, url = server
    expected = _policy_reference(ref)
    want_frames = decode_mp4(encode_mp4(_uint8(expected.video), 24))["frames"]
    form = {"prompt": "pick up the cup", "seed": "6", **{k: str(v) for k, v in STEPS.items()}}
    files = {"input_reference": ("frame.png", _png(_frame()), "image/png")}
    extra = {"extra_params": json.dumps(POLICY)}
    with httpx.Client(base_url=url, timeout=120) as c:
        r = c.post("/v1/videos/sync", data={**form, **extra}, files=files, headers={"Accept": "application/json"})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text
        answer = r.json()
        _check_actions(answer, expected)
        assert np.array_equal(decode_mp4(base64.b64decode(answer["b64_mp4"]))["frames"], want_frames)

        job = c.post("/v1/videos", data={**form, **extra}, files=files).json()
        deadline = time.monotonic() + 120
        while job["status"] not in ("completed", "failed") and time.monotonic() < deadline:
            time.sleep(0.05)
            job = c.get(f"/v1/videos/{job['id']}").json()
        assert job["status"] == "completed", job
        _check_actions(job, expected)
        assert np.array_equal(decode_mp4(c.get(f"/v1/videos/{job['id']}/content").content)["frames"], want_frames)


def test_policy_actions_over_chat(server, ref):
    from openai import OpenAI

    _, url = server
    client = OpenAI(base_url=f"{url}/v1", api_key="x")
    image_url = "data:image/png;base64," + base64.b64encode(_png(_frame())).decode()
    content = [{"type": "text", "text": "pick up the cup"}, {"type": "image_url", "image_url": {"url": image_url}}]
    r = client.chat.completions.create(
        model="tiny-cosmos3",
        messages=[{"role": "user", "content": content}],
        modalities=["video", "action"],
        extra_body={**STEPS, "seed": 6, **POLICY},
    )
    message = r.choices[0].message.model_dump()
    _check_actions(message, _policy_reference(ref))
    assert message["content"][0]["type"] == "video_url"


def test_policy_actions_stream_as_their_own_chat_chunk(server, ref):
    _, url = server
    image_url = "data:image/png;base64," + base64.b64encode(_png(_frame())).decode()
    content = [{"type": "text", "text": "pick up the cup"}, {"type": "image_url", "image_url": {"url": image_url}}]
    body = {
        "model": "tiny-cosmos3",
        "messages": [{"role": "user", "content": content}],
        "modalities": ["video", "action"],
        "stream": True,
        **STEPS,
        "seed": 6,
        **POLICY,
    }
    chunks = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    [action] = [c for c in chunks if c.get("modality") == "action"]
    _check_actions(action["choices"][0]["delta"], _policy_reference(ref))
    assert any(c.get("modality") == "video" for c in chunks)


def test_inverse_dynamics_from_a_chat_video(server, ref):
    """A chat turn's video (an MP4 data URL) is the clip inverse dynamics reads: the actions equal diffusers' on the
    same decoded frames."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
    from openai import OpenAI

    _, url = server
    clip = np.stack([np.random.default_rng(20 + i).integers(0, 255, (32, 48, 3), dtype=np.uint8) for i in range(5)])
    mp4 = encode_mp4(clip, 24)
    video_url = "data:video/mp4;base64," + base64.b64encode(mp4).decode()
    content = [{"type": "text", "text": "what moved"}, {"type": "video_url", "video_url": {"url": video_url}}]
    client = OpenAI(base_url=f"{url}/v1", api_key="x")
    r = client.chat.completions.create(
        model="tiny-cosmos3",
        messages=[{"role": "user", "content": content}],
        modalities=["video", "action"],
        extra_body={**STEPS, "seed": 8, **POLICY, "task": "inverse_dynamics"},
    )
    frames = list(decode_mp4(mp4)["frames"])  # what the server decodes the MP4 to
    cond = CosmosActionCondition(mode="inverse_dynamics", chunk_size=4, domain_name="av", resolution_tier=256,
                                 video=frames)  # fmt: skip
    expected = ref("what moved", action=cond, generator=gen(8), output_type="np", **STEPS)
    _check_actions(r.choices[0].message.model_dump(), expected)


def _clip_mp4(seed: int) -> tuple[bytes, list[np.ndarray]]:
    """A 5-frame MP4 and the frames the server decodes it to (PyAV)."""
    clip = np.stack([np.random.default_rng(seed + i).integers(0, 255, (32, 48, 3), dtype=np.uint8) for i in range(5)])
    mp4 = encode_mp4(clip, 24)
    return mp4, list(decode_mp4(mp4)["frames"])


def test_video_to_video_on_sync_from_a_file_and_a_url(server, ref):
    """/v1/videos/sync continues an input video, uploaded as ``video_reference`` or sent as a data: URL in JSON; the
    MP4 equals diffusers' video to video on the same decoded frames."""
    _, url = server
    mp4, frames = _clip_mp4(40)
    fields = {"prompt": "a boat", "size": "48x32", "num_frames": 9, "seed": 4, **STEPS}
    out = ref("a boat", video=frames, height=32, width=48, num_frames=9, generator=gen(4), output_type="np", **STEPS)
    want = decode_mp4(encode_mp4(_uint8(out.video), 24))["frames"]
    with httpx.Client(base_url=url, timeout=120) as c:
        files = {"video_reference": ("clip.mp4", mp4, "video/mp4")}
        r = c.post("/v1/videos/sync", data={k: str(v) for k, v in fields.items()}, files=files)
        assert r.status_code == 200 and r.headers["content-type"] == "video/mp4", r.text
        assert np.array_equal(decode_mp4(r.content)["frames"], want)
        data_url = "data:video/mp4;base64," + base64.b64encode(mp4).decode()
        r = c.post("/v1/videos/sync", json={**fields, "video_reference": {"url": data_url}})
        assert r.status_code == 200, r.text
        assert np.array_equal(decode_mp4(r.content)["frames"], want)


def test_inverse_dynamics_job_from_the_openai_client(server, ref):
    """The official client's ``videos.create`` with an MP4 as ``input_reference`` (a video/* upload is the input
    video): the job's actions and its MP4 equal diffusers' inverse dynamics on the same decoded frames."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
    from openai import OpenAI

    _, url = server
    mp4, frames = _clip_mp4(20)
    client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    extra = {"extra_params": json.dumps({**POLICY, "task": "inverse_dynamics"}), "seed": "8"}
    job = client.videos.create(
        model="tiny-cosmos3",
        prompt="what moved",
        input_reference=("clip.mp4", mp4, "video/mp4"),
        extra_body={**extra, **{k: str(v) for k, v in STEPS.items()}},
    )
    deadline = time.monotonic() + 120
    while job.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.05)
        job = client.videos.retrieve(job.id)
    assert job.status == "completed", job
    cond = CosmosActionCondition(mode="inverse_dynamics", chunk_size=4, domain_name="av", resolution_tier=256,
                                 video=frames)  # fmt: skip
    expected = ref("what moved", action=cond, generator=gen(8), output_type="np", **STEPS)
    _check_actions(job.model_dump(), expected)
    got = decode_mp4(client.videos.download_content(job.id).content)["frames"]
    assert np.array_equal(got, decode_mp4(encode_mp4(_uint8(expected.video), 24))["frames"])


@pytest.mark.parametrize(
    "request_kwargs, param",
    [
        ({"files": {"video_reference": ("clip.mp4", b"\0" * 64, "video/mp4")}}, "video_reference"),
        ({"files": {"input_reference": ("clip.mp4", b"\0" * 64, "video/mp4")}}, "input_reference"),
        ({"data": {"video_reference": "data:video/mp4;base64,AAAA"}}, "video_reference"),
        ({"data": {"extra_params": json.dumps({**POLICY, "task": "inverse_dynamics"})}}, "video_reference"),
    ],
    ids=["broken-file", "broken-input-reference", "broken-url", "inverse-dynamics-without-a-video"],
)
def test_bad_input_videos_are_400_naming_the_field(server, request_kwargs, param):
    _, url = server
    data = {"prompt": "x", **{k: str(v) for k, v in STEPS.items()}, **request_kwargs.get("data", {})}
    for path in ("/v1/videos/sync", "/v1/videos"):
        r = httpx.post(f"{url}{path}", data=data, files=request_kwargs.get("files"), timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)


@pytest.mark.parametrize(
    "extra, param",
    [
        ({**POLICY, "task": "dance"}, "task"),
        ({**POLICY, "task": "forward_dynamics", "actions": [[0.0] * 7] * 4}, "actions"),  # av actions are 9 wide
        ({**POLICY, "action_domain": "mars"}, "action_domain"),
    ],
)
def test_bad_action_requests_are_400_naming_the_field(server, extra, param):
    _, url = server
    body = {
        "prompt": "x",
        "image_reference": "data:image/png;base64," + base64.b64encode(_png(_frame())).decode(),
    }
    for path in ("/v1/videos/sync", "/v1/videos"):
        r = httpx.post(f"{url}{path}", json={**body, **STEPS, "extra_params": extra}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)


def test_models_lists_no_image_edits(server):
    """Cosmos3 draws images from text only (an input image is a video's first frame): /v1/models offers no edits."""
    _, url = server
    [card] = httpx.get(f"{url}/v1/models").json()["data"]
    assert card["routes"] == ["chat", "images.generations", "videos"]


def test_policy_without_a_first_frame_is_400_naming_the_reference(server):
    _, url = server
    r = httpx.post(f"{url}/v1/videos/sync", json={"prompt": "x", **STEPS, "extra_params": POLICY}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "image_reference", r.text  # the route's name
