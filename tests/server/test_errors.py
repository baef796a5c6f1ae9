"""Invalid input on every route answers 4xx in OpenAI's error shape naming the
field; the server stays healthy and concurrent good requests complete."""

from __future__ import annotations

import base64
import io
import json
import os
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from PIL import Image

from omnistage.errors import InvalidRequestError
from tests.server.conftest import error_of, new_engine
from tests.server.pipelines import image_pipeline, omni_pipeline

MAX_MEDIA = 100_000
MAX_BODY = 400_000


@pytest.fixture(scope="module")
def srv(server_factory, tmp_path_factory):
    media = tmp_path_factory.mktemp("allowed")
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.png").write_bytes(_png())
    os.symlink(outside / "secret.png", media / "link.png")  # a symlink may not escape the allowlist
    s = server_factory(
        new_engine(omni_pipeline()),
        allowed_local_media_path=str(media),
        max_media_bytes=MAX_MEDIA,
        max_body_bytes=MAX_BODY,
    )
    s.outside = outside
    return s


@pytest.fixture(scope="module")
def image_only(server_factory):
    return server_factory(new_engine(image_pipeline()), api_key="sekret")


def _png(size=(8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


def _noise_png(side: int) -> bytes:
    buf = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(buf, format="PNG")
    return buf.getvalue()


IMG = {"prompt": "x", "size": "8x8"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "modalities": ["text"]}

# (path, request kwargs, status, param the error must name (None: no single field))
JSON_CASES = [
    ("/v1/images/generations", {"json": {"prompt": 5}}, 400, "prompt"),
    ("/v1/images/generations", {"json": {}}, 400, "prompt"),
    ("/v1/images/generations", {"json": {**IMG, "size": "abc"}}, 400, "size"),
    ("/v1/images/generations", {"json": {**IMG, "n": 0}}, 400, "n"),
    ("/v1/images/generations", {"json": {**IMG, "n": 11}}, 400, "n"),
    ("/v1/images/generations", {"json": {**IMG, "n": "two"}}, 400, "n"),
    ("/v1/images/generations", {"json": {**IMG, "seed": -1}}, 400, "seed"),
    ("/v1/images/generations", {"json": {**IMG, "extra_body": {"seed": -5}}}, 400, "extra_body.seed"),
    ("/v1/chat/completions", {"json": {**CHAT, "seed": -1}}, 400, "seed"),
    (
        "/v1/chat/completions",
        {"json": {**CHAT, "sampling_params_list": [{"seed": -2}]}},
        400,
        "sampling_params_list[0].seed",
    ),
    ("/v1/images/generations", {"json": {**IMG, "num_inference_steps": 0}}, 400, "num_inference_steps"),
    ("/v1/images/generations", {"json": {**IMG, "guidance_scale": "high"}}, 400, "guidance_scale"),
    ("/v1/images/generations", {"json": {**IMG, "model": "nope"}}, 404, "model"),
    ("/v1/images/generations", {"json": {**IMG, "response_format": "url"}}, 400, "response_format"),
    ("/v1/images/generations", {"json": {**IMG, "output_format": "gif"}}, 400, "output_format"),
    ("/v1/images/generations", {"json": {**IMG, "extra_body": {"n": "many"}}}, 400, "extra_body.n"),
    ("/v1/images/generations", {"json": [1, 2]}, 400, None),
    ("/v1/images/generations", {"content": b'{"prompt": ', "headers": {"content-type": "application/json"}}, 400, None),
    ("/v1/images/edits", {"data": {"prompt": "p"}, "files": {"other": ("a.txt", b"x")}}, 400, "other"),
    ("/v1/images/edits", {"data": {"prompt": "p"}}, 415, None),  # urlencoded form: not multipart / JSON
    ("/v1/images/edits", {"json": {"prompt": "p"}}, 400, "image"),
    (
        "/v1/images/edits",
        {"files": {"image": ("a.png", b"not an image", "image/png")}, "data": {"prompt": "p"}},
        400,
        "image",
    ),
    (
        "/v1/images/edits",
        {
            "files": {"image": ("a.png", _png(), "image/png"), "mask": ("m.png", _png(), "image/png")},
            "data": {"prompt": "p"},
        },
        400,
        "mask",
    ),
    (
        "/v1/images/edits",
        {"files": {"image": ("a.png", _png(), "image/png")}, "data": {"prompt": "p", "n": "0"}},
        400,
        "n",
    ),
    ("/v1/images/edits", {"json": {"prompt": "p", "image_url": "ftp://host/a.png"}}, 400, "image_url"),
    ("/v1/images/edits", {"json": {"prompt": "p", "image_url": "data:image/png;base64,@@@"}}, 400, "image_url"),
    ("/v1/images/edits", {"json": {"prompt": "p", "image_url": "file:///etc/passwd"}}, 400, "image_url"),
    (
        "/v1/images/edits",
        {"content": b"--xx\r\nbroken", "headers": {"content-type": "multipart/form-data; boundary=xx"}},
        400,
        None,
    ),
    ("/v1/chat/completions", {"json": {"modalities": ["text"]}}, 400, "messages"),
    ("/v1/chat/completions", {"json": {"messages": "hi"}}, 400, "messages"),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "wizard", "content": "x"}]}}, 400, "messages[0].role"),
    (
        "/v1/chat/completions",
        {"json": {"messages": [{"role": "user", "content": [{"type": "smell"}]}]}},
        400,
        "messages[0].content",
    ),
    (
        "/v1/chat/completions",
        {
            "json": {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                    }
                ]
            }
        },
        400,
        "messages[0].content[0].image_url",
    ),
    ("/v1/chat/completions", {"json": {**CHAT, "modalities": ["smell"]}}, 400, "modalities"),
    ("/v1/chat/completions", {"json": {**CHAT, "temperature": "hot"}}, 400, "temperature"),
    ("/v1/chat/completions", {"json": {**CHAT, "temperature": 9}}, 400, "temperature"),  # refused by the stage
    ("/v1/chat/completions", {"json": {**CHAT, "n": 2}}, 400, "n"),
    ("/v1/chat/completions", {"json": {**CHAT, "sampling_params_list": [1]}}, 400, "sampling_params_list[0]"),
    ("/v1/chat/completions", {"json": {**CHAT, "sampling_params_list": [{}] * 5}}, 400, "sampling_params_list"),
    ("/v1/chat/completions", {"json": {**CHAT, "stream": True, "top_p": 3}}, 400, "top_p"),
    ("/v1/chat/completions", {"json": {**CHAT, "model": "gpt-4"}}, 404, "model"),
    (
        "/v1/chat/completions",
        {"json": {**CHAT, "modalities": ["image"], "num_inference_steps": 0}},
        400,
        "num_inference_steps",
    ),
    ("/v1/audio/speech", {"json": {"voice": "alto"}}, 400, "input"),
    ("/v1/audio/speech", {"json": {"input": "x", "speed": 10}}, 400, "speed"),
    ("/v1/audio/speech", {"json": {"input": "x", "speed": 2}}, 400, "speed"),  # model does not support it
    ("/v1/audio/speech", {"json": {"input": "x", "enable_text_splitting": True}}, 400, "enable_text_splitting"),
    ("/v1/audio/speech", {"json": {"input": "x", "response_format": "ogg"}}, 400, "response_format"),
    ("/v1/audio/speech", {"json": {"input": "x", "voice": "tenor"}}, 400, "voice"),
    ("/v1/audio/speech", {"json": {"input": "x", "stream": True, "response_format": "ogg"}}, 400, "response_format"),
    ("/v1/audio/speech", {"json": {"input": "x", "ref_audio": "UklGRg==", "ref_text": "x"}}, 400, "ref_audio"),
    ("/v1/audio/speech", {"json": {"input": "x", "initial_codec_chunk_frames": 0}}, 400, "initial_codec_chunk_frames"),
    (
        "/v1/videos",
        {
            "data": {"prompt": "p", "image_reference": "data:image/png;base64,AAAA"},
            "files": {"input_reference": ("r.png", _png(), "image/png")},
        },
        400,
        "input_reference",
    ),
    ("/v1/videos", {"json": {"prompt": "p", "input_reference": "x"}}, 400, "input_reference"),
    ("/v1/videos", {"json": {"prompt": "p", "size": "abc"}}, 400, "size"),
    ("/v1/videos", {"json": {"prompt": "p", "num_frames": 0}}, 400, "num_frames"),
    ("/v1/videos", {"json": {"prompt": "p", "colour": "red"}}, 400, "colour"),
    (
        "/v1/videos",
        {
            "data": {"prompt": "p", "extra_params": "{not json"},
            "files": {"input_reference": ("r.png", _png(), "image/png")},
        },
        400,
        "extra_params",
    ),
    ("/v1/videos/sync", {"json": {"prompt": "p", "num_inference_steps": -1}}, 400, "num_inference_steps"),
    ("/v1/videos/sync", {"json": {"prompt": "p", "model": "nope"}}, 404, "model"),
    # an input video for a model that takes none: named by the field it came in (JSON URL, file, video upload)
    ("/v1/videos", {"json": {"prompt": "p", "video_reference": "data:video/mp4;base64,AAAA"}}, 400, "video_reference"),
    (
        "/v1/videos/sync",
        {"data": {"prompt": "p"}, "files": {"video_reference": ("v.mp4", b"\0" * 8, "video/mp4")}},
        400,
        "video_reference",
    ),
    (
        "/v1/videos/sync",
        {"data": {"prompt": "p"}, "files": {"input_reference": ("v.mp4", b"\0" * 8, "video/mp4")}},
        400,
        "input_reference",
    ),
]


@pytest.mark.parametrize("path,kwargs,status,param", JSON_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(JSON_CASES)])
def test_invalid_input_names_the_field(srv, path, kwargs, status, param):
    r = srv.client().post(path, **kwargs)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["type"] in ("invalid_request_error", "not_found_error")
    if param is not None:
        assert err["param"] == param, err
        assert param.split("[")[0].split(".")[-1] in err["message"], err


def test_local_file_outside_allowlist_and_symlink_escape(srv):
    c = srv.client()
    for url in (
        f"file://{srv.outside}/secret.png",
        f"file://{srv.state.media.allowed_local_media_path}/link.png",
        f"file://{srv.state.media.allowed_local_media_path}/../{srv.outside.name}/secret.png",
    ):
        r = c.post("/v1/images/edits", json={"prompt": "p", "image_url": url})
        err = error_of(r)
        assert r.status_code == 400 and err["code"] == "local_media_not_allowed", err


def test_oversized_upload_and_body(srv):
    c = srv.client()
    big = _noise_png(200)  # ~120 kB: over the per-file limit, under the body limit
    assert MAX_MEDIA < len(big) < MAX_BODY
    r = c.post("/v1/images/edits", files={"image": ("a.png", big, "image/png")}, data={"prompt": "p"})
    assert r.status_code == 413 and error_of(r)["param"] == "image"
    r = c.post(
        "/v1/images/edits", files={"image": ("a.png", b"x" * (MAX_BODY + 10), "image/png")}, data={"prompt": "p"}
    )
    assert r.status_code == 413 and error_of(r)
    data_url = "data:image/png;base64," + base64.b64encode(big).decode()
    r = c.post("/v1/images/edits", json={"prompt": "p", "image_url": data_url})
    assert r.status_code == 413 and error_of(r)["param"] == "image_url"


def test_chunked_oversized_body_is_refused(srv):
    def chunks():
        for _ in range(MAX_BODY // 10_000 + 5):
            yield b"x" * 10_000

    r = srv.client().post("/v1/images/generations", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)


@pytest.mark.parametrize(
    "method,path",
    [
        ("get", "/v1/videos/video_" + "0" * 32),
        ("get", "/v1/videos/nope/content"),
        ("delete", "/v1/videos/video_" + "1" * 32),
        ("get", "/v1/videos/..%2F..%2Fetc%2Fpasswd/content"),
    ],
)
def test_unknown_video_id(srv, method, path):
    r = getattr(srv.client(), method)(path)
    assert r.status_code == 404
    assert error_of(r)["code"] in ("video_not_found", None)


def test_stage_fault_is_500_for_that_request_only(srv):
    c = srv.client()
    r = c.post("/v1/images/generations", json={"prompt": "crash: now", "size": "8x8"})
    assert r.status_code == 500 and error_of(r)["code"] == "stage_failed"
    assert c.post("/v1/images/generations", json=IMG).status_code == 200
    assert c.get("/health").status_code == 200


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
def test_raw_audio_stream_cut_by_a_stage_fault_breaks_off(srv, fmt):
    """A raw audio stream has no event framing: a fault after it started must not end it like a complete one
    (the client would keep truncated audio as the answer); the response is broken off instead. The same
    request as SSE ends with an error event; the server stays healthy."""
    body = {"input": "hello there my good friend tone-crash", "stream": True, "response_format": fmt}
    got = []
    with srv.client() as c:
        with c.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):
                for chunk in r.iter_bytes():
                    got.append(chunk)
        assert got  # audio had been sent before the fault
        with c.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "sse"}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert events[0]["type"] == "speech.audio.delta" and events[-1]["error"]["code"] == "stage_failed"
        whole = c.post("/v1/audio/speech", json={**body, "input": "hello there", "stream": True})
        assert whole.status_code == 200 and whole.content  # a good stream still ends normally
        assert c.get("/health").status_code == 200


def test_server_healthy_and_good_requests_complete_among_bad_ones(srv):
    good = [
        ("/v1/images/generations", {"json": {**IMG, "n": 2}}),
        ("/v1/chat/completions", {"json": CHAT}),
        ("/v1/audio/speech", {"json": {"input": "a b"}}),
        ("/v1/videos/sync", {"json": {"prompt": "p", "num_frames": 2}}),
    ] * 3
    bad = [(p, kw) for p, kw, _, _ in JSON_CASES[:12]]

    def send(item):
        path, kw = item
        with srv.client() as c:
            return path, kw, c.post(path, **kw).status_code

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, [x for pair in zip(good + good, bad) for x in pair]))
    statuses = {(p, str(kw)): s for p, kw, s in results}
    for path, kw in good:
        assert statuses[(path, str(kw))] == 200, path
    for path, kw in bad:
        assert 400 <= statuses[(path, str(kw))] < 500
    health = srv.client().get("/health")
    assert health.status_code == 200 and health.json()["in_flight"] == 0


def test_routes_refuse_modalities_the_model_lacks(image_only):
    c = image_only.client(headers={"Authorization": "Bearer sekret"})
    for path, body in (
        ("/v1/audio/speech", {"input": "x"}),
        ("/v1/videos", {"prompt": "p"}),
        ("/v1/videos/sync", {"prompt": "p"}),
    ):
        r = c.post(path, json=body)
        err = error_of(r)
        assert r.status_code == 400 and "does not produce" in err["message"] and "test_image" in err["message"], err
    r = c.get("/v1/audio/voices")
    assert r.status_code == 400 and "does not produce audio" in error_of(r)["message"]
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "modalities": ["audio"]})
    assert r.status_code == 400 and error_of(r)["param"] == "modalities"
    assert c.post("/v1/images/generations", json=IMG).status_code == 200


def test_api_key(image_only):
    plain = image_only.client()
    for path in ("/v1/models", "/v1/images/generations"):
        r = plain.post(path, json=IMG) if "images" in path else plain.get(path)
        assert r.status_code == 401 and error_of(r)["type"] == "authentication_error"
    r = plain.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert plain.get("/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert plain.get("/health").status_code == 200  # health and metrics stay open for probes
    assert plain.get("/metrics").status_code == 200


def test_openapi_documents_the_errors_the_server_really_answers(srv):
    """No route claims a 422 (the server answers 400); every /v1 route documents OpenAI-shaped errors."""
    doc = srv.client().get("/openapi.json").json()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    error_schema = doc["components"]["schemas"]["ErrorResponse"]
    assert set(error_schema["properties"]) == {"error"}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (method, path)
            if path.startswith("/v1/"):
                for status in ("400", "401", "404", "500", "503"):
                    ref = op["responses"][status]["content"]["application/json"]["schema"]["$ref"]
                    assert ref.endswith("/ErrorResponse"), (method, path, status)
    assert "413" in doc["paths"]["/v1/images/edits"]["post"]["responses"]


@pytest.mark.parametrize("entry", [{"temperature": "hot"}, {"max_tokens": 0}, {"n": 2}, {"not_a_field": 1}])
def test_a_bad_llm_entry_is_the_same_error_offline_and_over_http(srv, entry):
    """Checked once, at admission (LLMSamplingParams), before any stage runs: the same field and message."""
    with pytest.raises(InvalidRequestError) as offline:
        srv.engine.make_request("x", sampling_params_list=[entry])
    r = srv.client().post("/v1/chat/completions", json={**CHAT, "sampling_params_list": [entry]})
    assert r.status_code == 400, r.text
    error = error_of(r)
    assert error["param"] == offline.value.field and offline.value.field.startswith("sampling_params_list[0]")
    assert error["message"] == f"{offline.value.field}: {offline.value.message}"


def test_a_bad_llm_knob_reads_the_same_at_the_top_level_and_in_an_entry(srv):
    """The top level is the body model's check (RequestKnobs), an entry LLMSamplingParams': the same words."""
    with pytest.raises(InvalidRequestError) as offline:
        srv.engine.make_request("x", sampling_params_list=[{"temperature": -1}])
    r = srv.client().post("/v1/chat/completions", json={**CHAT, "temperature": -1})
    assert r.status_code == 400 and error_of(r)["message"] == f"temperature: {offline.value.message}", r.text


def test_streamed_request_refused_by_the_stage_is_a_400_not_an_error_event(srv):
    """What only the stage can judge (here the test engine's temperature limit) still answers 400: the
    response starts after the stage accepted the request."""
    r = srv.client().post("/v1/chat/completions", json={**CHAT, "temperature": 9, "stream": True})
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == "temperature"
    ok = srv.client().post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert ok.status_code == 200 and ok.text.rstrip().endswith("data: [DONE]")
