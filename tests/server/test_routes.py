"""End to end through a real server: the official openai client and raw HTTP for every route."""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path

import av
import numpy as np
import openai
import pytest
import soundfile as sf
from PIL import Image

from tests.server.conftest import new_engine
from tests.server.pipelines import SAMPLE_RATE, omni_pipeline


@pytest.fixture(scope="module")
def srv(server_factory, tmp_path_factory):
    media = tmp_path_factory.mktemp("media")
    s = server_factory(new_engine(omni_pipeline()), allowed_local_media_path=str(media))
    s.media_dir = media
    return s


@pytest.fixture(scope="module")
def oai(srv):
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


def decode_png(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def png_bytes(color=(200, 30, 30), size=(20, 12)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def test_models_list(oai, srv):
    models = oai.models.list().data
    assert [m.id for m in models] == ["test_omni"]
    assert oai.models.retrieve("test_omni").id == "test_omni"
    assert srv.client().get("/v1/models/nope").status_code == 404


def test_default_is_the_one_model_served(oai, srv):
    """Clients written for vLLM-Omni send ``model: "default"``: answered as the model served (not listed)."""
    assert [m.id for m in oai.models.list().data] == ["test_omni"]
    assert oai.models.retrieve("default").id == "test_omni"
    asked = [
        oai.images.generate(model=m, prompt="a red square", size="48x32", extra_body={"seed": 3})
        for m in ("default", "test_omni")
    ]
    assert asked[0].data[0].b64_json == asked[1].data[0].b64_json
    chat = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.model == "test_omni"
    r = srv.client().post(
        "/v1/chat/completions", json={"model": "defaults", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 404 and "'test_omni'" in r.json()["error"]["message"]


def test_images_generate_size_count_and_seed(oai):
    resp = oai.images.generate(prompt="a red square", n=3, size="48x32", extra_body={"seed": 7})
    images = [decode_png(d.b64_json) for d in resp.data]
    assert [im.size for im in images] == [(48, 32)] * 3
    again = oai.images.generate(prompt="a red square", n=1, size="48x32", extra_body={"seed": 7})
    # Same seed -> same first image; the server passed the seed through to the stage.
    assert np.array_equal(np.asarray(images[0]), np.asarray(decode_png(again.data[0].b64_json)))
    other = oai.images.generate(prompt="a red square", n=1, size="48x32", extra_body={"seed": 8})
    assert not np.array_equal(np.asarray(images[0]), np.asarray(decode_png(other.data[0].b64_json)))


def test_images_output_formats(srv):
    c = srv.client()
    for fmt, magic in (("jpeg", b"\xff\xd8"), ("webp", b"RIFF"), ("png", b"\x89PNG")):
        r = c.post("/v1/images/generations", json={"prompt": "x", "size": "16x16", "output_format": fmt})
        assert r.status_code == 200, r.text
        assert base64.b64decode(r.json()["data"][0]["b64_json"]).startswith(magic)


def test_images_edit_multipart_several_images(oai, srv):
    resp = oai.images.edit(
        image=[("a.png", png_bytes(), "image/png"), ("b.png", png_bytes((0, 0, 255)), "image/png")],
        prompt="make it blue",
        size="24x40",
        n=2,
    )
    assert [decode_png(d.b64_json).size for d in resp.data] == [(24, 40)] * 2
    # The input image reached the stage: red and blue inputs give different outputs.
    r1 = srv.client().post(
        "/v1/images/edits",
        files={"image": ("a.png", png_bytes((255, 0, 0)), "image/png")},
        data={"prompt": "p", "size": "16x16"},
    )
    r2 = srv.client().post(
        "/v1/images/edits",
        files={"image": ("a.png", png_bytes((0, 0, 255)), "image/png")},
        data={"prompt": "p", "size": "16x16"},
    )
    assert r1.status_code == r2.status_code == 200
    assert r1.json()["data"][0]["b64_json"] != r2.json()["data"][0]["b64_json"]


def test_images_edit_by_url(srv):
    """An image given by URL (data: or an allowed file://) edits to the same pixels as the same file uploaded, in
    the order given (the stage starts from the first image)."""
    c = srv.client()
    params = {"prompt": "p", "size": "16x16", "seed": 3}

    def pixels(r) -> np.ndarray:
        assert r.status_code == 200, r.text
        return np.asarray(decode_png(r.json()["data"][0]["b64_json"]))

    def uploaded(*images: bytes) -> np.ndarray:
        files = [("image", (f"{i}.png", data, "image/png")) for i, data in enumerate(images)]
        return pixels(c.post("/v1/images/edits", data={k: str(v) for k, v in params.items()}, files=files))

    red, blue = png_bytes(), png_bytes((0, 0, 255))
    data_url = "data:image/png;base64," + base64.b64encode(red).decode()
    by_url = pixels(c.post("/v1/images/edits", json={**params, "image_url": data_url}))
    assert np.array_equal(by_url, uploaded(red))
    (srv.media_dir / "in.png").write_bytes(blue)
    both = pixels(
        c.post("/v1/images/edits", json={**params, "image_url": [f"file://{srv.media_dir}/in.png", data_url]})
    )
    assert np.array_equal(both, uploaded(blue, red))
    assert not np.array_equal(both, by_url)  # (the blue file came first)


def test_chat_text_nonstream(oai):
    resp = oai.chat.completions.create(
        model="test_omni",
        messages=[{"role": "user", "content": "hello big world"}],
        extra_body={"modalities": ["text"]},
    )
    assert resp.choices[0].message.content == "echo hello big world"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens == 4 and resp.usage.prompt_tokens == 6


def test_chat_max_tokens_routed_to_llm_stage(oai):
    resp = oai.chat.completions.create(
        model="test_omni",
        messages=[{"role": "user", "content": "a b c d e"}],
        max_tokens=2,
        extra_body={"modalities": ["text"]},
    )
    assert resp.choices[0].message.content == "echo a"
    assert resp.choices[0].finish_reason == "length"


def test_chat_stream_with_usage(oai):
    stream = oai.chat.completions.create(
        model="test_omni",
        messages=[{"role": "user", "content": "one two three"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"modalities": ["text"]},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo one two three"
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) == 4  # streamed word by word, not in one piece
    assert all(c.model_extra.get("modality") == "text" for c in content_chunks)
    assert chunks[-1].usage.completion_tokens == 4 and chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_chat_stream_text_and_audio(srv):
    body = {"messages": [{"role": "user", "content": "la la"}], "modalities": ["text", "audio"], "stream": True}
    with srv.client().stream("POST", "/v1/chat/completions", json=body) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    import json

    chunks = [json.loads(e) for e in events[:-1]]
    audio = [c for c in chunks if c.get("modality") == "audio"]
    assert audio, chunks
    pcm = b"".join(base64.b64decode(c["choices"][0]["delta"]["audio"]["data"]) for c in audio)
    # 3 words ("echo la la") x 0.05 s of 16-bit PCM, streamed while the text was generated.
    assert len(pcm) == 3 * int(0.05 * SAMPLE_RATE) * 2


def test_chat_image_output_as_content_items_with_stage_metrics(srv):
    body = {
        "messages": [{"role": "user", "content": "draw"}],
        "modalities": ["image"],
        "size": "20x10",
        "extra_body": {"n": 2},
        "return_stage_metrics": True,
    }
    r = srv.client().post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert [p["type"] for p in content] == ["image_url", "image_url"]
    url = content[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert decode_png(url.split(",", 1)[1]).size == (20, 10)
    assert set(r.json()["stage_metrics"]) == {"2"}


def test_chat_extra_body_nested_equals_top_level(srv):
    c = srv.client()
    base = {"messages": [{"role": "user", "content": "draw"}], "modalities": ["image"]}
    top = c.post("/v1/chat/completions", json={**base, "size": "12x12", "seed": 3}).json()
    nested = c.post("/v1/chat/completions", json={**base, "extra_body": {"size": "12x12", "seed": 3}}).json()
    assert top["choices"][0]["message"]["content"] == nested["choices"][0]["message"]["content"]


def test_chat_sampling_params_list(srv):
    body = {
        "messages": [{"role": "user", "content": "a b c"}],
        "modalities": ["text"],
        "sampling_params_list": [{"max_tokens": 1}],
    }
    r = srv.client().post("/v1/chat/completions", json=body)
    assert r.json()["choices"][0]["message"]["content"] == "echo"


def test_chat_image_input_and_audio_output(srv):
    data_url = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()
    body = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "say hi"}, {"type": "image_url", "image_url": {"url": data_url}}],
            }
        ],
        "modalities": ["text", "audio"],
    }
    r = srv.client().post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["content"] == "echo say hi"
    wav, sr = sf.read(io.BytesIO(base64.b64decode(msg["audio"]["data"])))
    assert sr == SAMPLE_RATE and len(wav) == 3 * int(0.05 * SAMPLE_RATE)


def test_speech_formats_and_stream(srv):
    c = srv.client()
    r = c.post("/v1/audio/speech", json={"input": "one two", "voice": "alto", "response_format": "flac"})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/flac"
    audio, sr = sf.read(io.BytesIO(r.content))
    assert sr == SAMPLE_RATE and len(audio) == 3 * int(0.05 * SAMPLE_RATE)
    with c.stream("POST", "/v1/audio/speech", json={"input": "one two", "stream": True, "response_format": "pcm"}) as s:
        assert s.status_code == 200
        pcm = b"".join(s.iter_bytes())
    assert len(pcm) == 3 * int(0.05 * SAMPLE_RATE) * 2
    assert c.get("/v1/audio/voices").json()["voices"] == ["alto", "bass"]


def _frames(mp4: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(mp4)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


def test_video_job_lifecycle(srv):
    c = srv.client()
    r = c.post(
        "/v1/videos",
        data={"prompt": "waves", "size": "32x16", "num_frames": "5", "fps": "10"},
        files={"input_reference": ("ref.png", png_bytes(), "image/png")},
    )
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["status"] == "queued" and job["object"] == "video" and job["id"].startswith("video_")
    for _ in range(500):
        job = c.get(f"/v1/videos/{job['id']}").json()
        if job["status"] in ("completed", "failed"):
            break
        time.sleep(0.02)
    assert job["status"] == "completed" and job["progress"] == 100, job
    assert job["id"] in [j["id"] for j in c.get("/v1/videos").json()["data"]]
    content = c.get(f"/v1/videos/{job['id']}/content")
    assert content.headers["content-type"] == "video/mp4"
    frames = _frames(content.content)
    assert len(frames) == 5 and frames[0].shape == (16, 32, 3)
    assert c.delete(f"/v1/videos/{job['id']}").json()["deleted"] is True
    assert c.get(f"/v1/videos/{job['id']}").status_code == 404
    assert not list(Path(srv.state.storage.root).glob(f"{job['id']}*"))


def test_video_sync(srv):
    start = time.monotonic()
    r = srv.client().post("/v1/videos/sync", json={"prompt": "p", "width": 24, "height": 8, "seconds": 0.5, "fps": 8})
    elapsed = time.monotonic() - start
    assert r.status_code == 200, r.text
    # seconds (3 decimals) the server spent on it: within what the client waited
    assert r.headers["x-model"] == "test_omni" and 0 <= float(r.headers["x-inference-time-s"]) <= elapsed + 0.001
    assert r.headers["x-request-id"]
    frames = _frames(r.content)
    assert len(frames) == 4 and frames[0].shape == (8, 24, 3)


def test_request_id_echoed_and_metrics(srv):
    c = srv.client()
    r = c.post(
        "/v1/images/generations", json={"prompt": "x", "size": "8x8", "n": 2}, headers={"X-Request-Id": "my-id-1"}
    )
    assert r.headers["x-request-id"] == "my-id-1"
    text = c.get("/metrics").text
    assert 'omnistage_requests_total{route="/v1/images/generations",status="200"}' in text
    assert "omnistage_request_latency_seconds_bucket" in text
    assert 'omnistage_stage_queue_depth{stage="2"}' in text and 'omnistage_stage_running{stage="0"}' in text
    images = [
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("omnistage_images_generated_total")
    ]
    assert images and images[0] >= 2
    tokens = [
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("omnistage_generation_tokens_total")
    ]
    assert tokens and tokens[0] > 0


def test_playground_or_info_at_root(srv):
    r = srv.client().get("/")
    assert r.status_code == 200


def test_served_model_name_is_what_a_person_would_type(tiny_model):
    from omnistage import AsyncOmni
    from omnistage.server.state import default_model_name

    assert default_model_name(AsyncOmni()) == "omnistage-demo"  # the built-in demo, not its weights path
    folder = tiny_model("sd3")
    assert default_model_name(AsyncOmni(folder)) == folder.name
