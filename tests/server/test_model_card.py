"""What the playground builds on, through a real server with small real-torch pipelines: the model card in
``/v1/models`` (routes, stages, defaults, voices), the page's static files, and ``return_stage_metrics`` on the
routes whose body is media (speech, videos)."""

from __future__ import annotations

import base64
import dataclasses
import json
import time

import numpy as np
import pytest

from omnistage.pipeline import Pipeline, StageSpec
from tests.server.conftest import new_engine
from tests.server.pipelines import SAMPLE_RATE, ImageAdapter, omni_pipeline


def image_pipeline_with_defaults() -> Pipeline:
    return Pipeline(
        name="test_image_defaults",
        stages=[
            StageSpec(
                0,
                kind="generation",
                adapter=ImageAdapter,
                output="image",
                final=True,
                default_params={"height": 48, "width": 80, "num_inference_steps": 7, "guidance_scale": 1.5},
            )
        ],
    )


@pytest.fixture(scope="module")
def omni(server_factory):
    return server_factory(new_engine(omni_pipeline()))


@pytest.fixture(scope="module")
def image_only(server_factory):
    return server_factory(new_engine(image_pipeline_with_defaults()), served_model_name="pictures")


def card_of(srv) -> dict:
    with srv.client() as c:
        listed = c.get("/v1/models").json()["data"]
        assert len(listed) == 1
        assert c.get(f"/v1/models/{listed[0]['id']}").json() == listed[0]
    return listed[0]


def test_card_of_a_model_with_every_output(omni):
    card = card_of(omni)
    assert card["id"] == "test_omni" and card["pipeline"] == "test_omni"
    assert card["output_modalities"] == ["text", "image", "audio", "video"]
    assert card["routes"] == ["chat", "images.generations", "images.edits", "audio.speech", "videos"]
    assert [(s["stage_id"], s["kind"], s["output"], s["final"], s["inputs"]) for s in card["stages"]] == [
        (0, "llm", "text", True, []),
        (1, "generation", "audio", True, [0]),
        (2, "generation", "image", True, []),
        (3, "generation", "video", True, []),
    ]
    assert card["voices"] == ["alto", "bass"]
    # the video stage's declared defaults (no diffusion stage: the final generation stages take the knobs)
    assert card["defaults"] == {"num_frames": 4, "fps": 8}


def test_card_of_an_image_model(image_only):
    card = card_of(image_only)
    assert card["id"] == "pictures"
    assert card["routes"] == ["chat", "images.generations", "images.edits"]
    assert "voices" not in card
    assert card["defaults"] == {
        "height": 48,
        "width": 80,
        "size": "80x48",
        "num_inference_steps": 7,
        "guidance_scale": 1.5,
    }


def test_a_pipeline_can_refuse_chat(server_factory):
    pipeline = omni_pipeline()
    pipeline.info = dataclasses.replace(pipeline.info, chat=False)
    card = card_of(server_factory(new_engine(pipeline)))
    assert card["routes"] == ["images.generations", "images.edits", "audio.speech", "videos"]


def test_a_text_to_image_model_lists_no_edits(server_factory):
    pipeline = image_pipeline_with_defaults()
    pipeline.info = dataclasses.replace(pipeline.info, image_edits=False)  # as a family that refuses input images
    card = card_of(server_factory(new_engine(pipeline)))
    assert card["routes"] == ["chat", "images.generations"]


def test_audio_without_declared_speech_is_not_served_as_speech(server_factory):
    pipeline = omni_pipeline()
    pipeline.info = dataclasses.replace(pipeline.info, speech=None)  # audio out, but no voice to speak with
    card = card_of(server_factory(new_engine(pipeline)))
    assert card["routes"] == ["chat", "images.generations", "images.edits", "videos"]
    assert "voices" not in card


def test_the_page_and_its_static_files(image_only):
    with image_only.client() as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        for name, ctype in (
            ("playground.js", "text/javascript"),
            ("playground.css", "text/css"),
            ("playground-talk.js", "text/javascript"),
        ):
            assert f"/static/{name}" in page.text
            r = c.get(f"/static/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(ctype) and len(r.text) > 500
        r = c.get("/static/talk-worklet.js")  # loaded by playground-talk.js (audioWorklet.addModule)
        assert r.status_code == 200 and "registerProcessor" in r.text
        for bad in ("nope.js", "..%2Fapp.py", "playground.html"):
            r = c.get(f"/static/{bad}")
            assert r.status_code == 404, (bad, r.status_code)


def _stage_ids(metrics: dict) -> list[str]:
    fields = {"queue_time_s", "run_time_s", "num_tokens", "num_steps", "peak_memory_mb"}
    assert all(fields <= set(m) for m in metrics.values()), metrics
    return sorted(metrics)


def test_speech_returns_stage_metrics_when_asked(omni):
    body = {"input": "hello world", "voice": "alto", "return_stage_metrics": True}
    with omni.client() as c:
        whole = c.post("/v1/audio/speech", json=body)
        assert whole.status_code == 200, whole.text
        metrics = json.loads(whole.headers["x-stage-metrics"])
        assert _stage_ids(metrics) == ["0", "1"]
        assert metrics["0"]["num_tokens"] == 3  # "echo hello world": the word engine's three words
        assert "x-stage-metrics" not in c.post("/v1/audio/speech", json={**body, "return_stage_metrics": False}).headers

        events = []
        with c.stream("POST", "/v1/audio/speech", json={**body, "stream": True, "stream_format": "sse"}) as r:
            assert r.status_code == 200
            events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
        done = events[-1]
        assert done["type"] == "speech.audio.done" and _stage_ids(done["stage_metrics"]) == ["0", "1"]
        pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        # three words of 0.05 s each, streamed in pieces
        assert len(events) > 2 and len(np.frombuffer(pcm, "<i2")) == 3 * int(0.05 * SAMPLE_RATE)

        raw = c.post("/v1/audio/speech", json={**body, "stream": True, "response_format": "pcm"})
        assert raw.status_code == 400 and raw.json()["error"]["param"] == "return_stage_metrics", raw.text


def test_video_job_and_sync_return_stage_metrics_when_asked(omni):
    with omni.client() as c:
        job = c.post("/v1/videos", json={"prompt": "a ball", "size": "32x16", "return_stage_metrics": True}).json()
        assert job["stage_metrics"] is None  # only once it is done
        deadline = time.monotonic() + 60
        while job["status"] not in ("completed", "failed") and time.monotonic() < deadline:
            time.sleep(0.05)
            job = c.get(f"/v1/videos/{job['id']}").json()
        assert job["status"] == "completed", job
        assert _stage_ids(job["stage_metrics"]) == ["3"]
        plain = c.post("/v1/videos", json={"prompt": "a ball", "size": "32x16"}).json()
        assert plain["stage_metrics"] is None

        sync = c.post(
            "/v1/videos/sync",
            files={"prompt": (None, "a ball"), "size": (None, "32x16"), "return_stage_metrics": (None, "true")},
        )
        assert sync.status_code == 200 and _stage_ids(json.loads(sync.headers["x-stage-metrics"])) == ["3"]
