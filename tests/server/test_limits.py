"""Server-wide caps (--max-image-pixels, --max-num-frames, --max-inference-steps, --max-tokens): a request
above one is a 400 naming the field the caller sent, before any model work (the test stages would fail
a ``crash:`` prompt with a 500 if it reached them); requests at the caps run."""

from __future__ import annotations

import pytest

from tests.server.conftest import error_of, new_engine
from tests.server.pipelines import image_pipeline, omni_pipeline

CAPS = dict(max_image_pixels=48 * 32, max_num_frames=6, max_inference_steps=10, max_tokens=5)


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory(new_engine(omni_pipeline()), **CAPS)


@pytest.mark.parametrize(
    "route,body,param",
    [
        ("/v1/images/generations", {"size": "48x48"}, "size"),
        ("/v1/images/generations", {"width": 48, "height": 48}, "height"),
        ("/v1/images/generations", {"extra_body": {"width": 64}}, "width"),
        ("/v1/images/generations", {"num_inference_steps": 11}, "num_inference_steps"),
        ("/v1/videos/sync", {"num_frames": 7}, "num_frames"),
        ("/v1/videos/sync", {"size": "64x32"}, "size"),
        ("/v1/videos", {"num_frames": 7}, "num_frames"),
        ("/v1/chat/completions", {"max_tokens": 6, "modalities": ["text"]}, "max_tokens"),
        ("/v1/chat/completions", {"max_completion_tokens": 6, "modalities": ["text"]}, "max_completion_tokens"),
        (
            "/v1/chat/completions",
            {"sampling_params_list": [{"max_tokens": 9}], "modalities": ["text"]},
            "sampling_params_list[0].max_tokens",
        ),
    ],
)
def test_above_a_cap_is_400_naming_the_field_before_any_work(srv, route, body, param):
    if route == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": "crash: now"}], **body}
    else:
        body = {"prompt": "crash: now", **body}
    r = srv.client().post(route, json=body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["param"] == param and "limit" in err["message"], err
    assert srv.engine.running_requests() == []
    assert srv.state.videos == {}  # no video job was created for a refused request


def test_requests_at_the_caps_run(srv):
    c = srv.client()
    r = c.post("/v1/images/generations", json={"prompt": "x", "size": "48x32", "num_inference_steps": 10})
    assert r.status_code == 200 and r.json()["size"] == "48x32"
    r = c.post("/v1/videos/sync", json={"prompt": "x", "size": "48x32", "num_frames": 6})
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
    r = c.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "a b c d e f g"}], "max_tokens": 5, "modalities": ["text"]},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5


def test_default_caps_refuse_the_8192_square_at_once(server_factory):
    """The issue's case: 8192x8192 on an image model is refused by the default --max-image-pixels."""
    srv = server_factory(new_engine(image_pipeline()))
    r = srv.client().post("/v1/images/generations", json={"prompt": "crash: x", "size": "8192x8192"})
    assert r.status_code == 400 and error_of(r)["param"] == "size"
    assert "16777216" in error_of(r)["message"]  # the documented default, 4096 x 4096


def test_deploy_defaults_are_the_operators_choice_not_capped(server_factory):
    """The test video stage defaults to 4 frames (its deploy defaults): a --max-num-frames of 3 bounds what
    callers ask for, not the model's own default."""
    srv = server_factory(new_engine(omni_pipeline()), max_num_frames=3)
    c = srv.client()
    assert c.post("/v1/videos/sync", json={"prompt": "x", "size": "16x16"}).status_code == 200
    r = c.post("/v1/videos/sync", json={"prompt": "x", "size": "16x16", "num_frames": 5})
    assert r.status_code == 400 and error_of(r)["param"] == "num_frames"
