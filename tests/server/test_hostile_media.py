"""Hostile inputs at every place media and JSON enter the HTTP API, against real servers (the test
pipelines' stage engines; one whose first stage is an llm, so chat media is checked for vLLM, and one
that decodes chat media itself): decompression bombs, lying container headers, truncated files, the
wrong declared type and a 100 000-deep JSON body. Each must be a 4xx naming the field, refused before the
engine runs anything (how long a refusal takes: benchmarks/hostile_media.py), and the process's RSS (the server runs in this process) must not jump by more than the declared limits.

The hostile files are made here: a PNG declaring 60000x60000 pixels (a few hundred KB of zlib over
zero rows), a WAV header declaring ten hours, a WAV of "unknown length" holding more than the limit, a
FLAC whose STREAMINFO declares ten hours, an MP4 whose ``stts`` declares 10^9 frames, an MP4 larger
per frame than the pixel limit, files cut in half, a text file called a PNG.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import struct
import zlib

import av  # noqa: F401 - imported before the RSS baseline: the server imports it lazily
import numpy as np
import psutil
import pytest
import soundfile
from PIL import Image

from omnistage.info import RecognizerInfo
from omnistage.media.json_depth import json_too_deep
from omnistage.server.media import encode_image, encode_mp4
from omnistage.server.realtime.protocol import ProtocolError, parse
from omnistage.testing.server import serve_app
from tests.server.conftest import error_of, new_engine
from tests.server.pipelines import image_pipeline, omni_pipeline

MAX_PIXELS = 256 * 256
MAX_AUDIO_S = 30.0
MAX_FRAMES = 16
# what the limits let one input decode to (RGBA + RGB image; float32 mono at 48 kHz; frames) plus what the
# server holds of the request itself; any bomb above decodes to gigabytes
RSS_BUDGET = 64 << 20


# --------------------------------------------------------------------------- hostile files


def png(size=(64, 64)) -> bytes:
    arr = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    return encode_image(Image.fromarray(arr), "png")


def png_bomb(side: int = 60000, rows: int = 1000) -> bytes:
    """An RGB PNG whose IHDR declares side x side pixels; its IDAT inflates to ``rows`` zero rows."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    z = zlib.compressobj(9)
    row = bytes(1 + 3 * side)
    idat = b"".join(z.compress(row) for _ in range(rows)) + z.flush()
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", idat)
        + chunk(b"IEND", b"")
    )


def wav(seconds: float, rate: int = 8000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def wav_header(rate: int, data_bytes: int) -> bytes:
    return (
        b"RIFF"
        + struct.pack("<I", min(data_bytes + 36, 0xFFFFFFFF))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )


def wav_claiming(seconds: float, rate: int = 48000, holds_s: float = 0.1) -> bytes:
    """A WAV whose header declares ``seconds`` and whose data holds ``holds_s``."""
    body = (np.random.default_rng(1).standard_normal(int(holds_s * rate)) * 1000).astype("<i2").tobytes()
    return wav_header(rate, int(seconds * rate) * 2) + body


def wav_unknown_length(seconds: float, rate: int = 8000) -> bytes:
    """A streamed WAV (sizes 0xFFFFFFFF: "unknown") that holds ``seconds``: only the decode can tell."""
    return wav_header(rate, 0xFFFFFFFF) + wav(seconds, rate)[44:]


def flac_claiming(seconds: float, rate: int = 8000) -> bytes:
    """A short FLAC whose STREAMINFO declares ``seconds`` (total samples: the low 36 bits at bytes 18..25)."""
    buf = io.BytesIO()
    soundfile.write(buf, np.zeros(rate // 10, np.float32), rate, format="FLAC", subtype="PCM_16")
    data = bytearray(buf.getvalue())
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first
    packed = struct.unpack(">Q", data[18:26])[0]
    packed = (packed & ~((1 << 36) - 1)) | int(seconds * rate)
    data[18:26] = struct.pack(">Q", packed)
    return bytes(data)


def mp4(frames: int = 4, h: int = 32, w: int = 32) -> bytes:
    return encode_mp4(np.random.default_rng(2).integers(0, 255, (frames, h, w, 3), dtype=np.uint8), 8)


def mp4_claiming_frames(count: int = 10**9) -> bytes:
    """A 4-frame MP4 whose single ``stts`` entry declares ``count`` samples (FFmpeg's nb_frames)."""
    data = bytearray(mp4())
    i = data.find(b"stts")
    assert struct.unpack(">II", data[i + 4 : i + 12]) == (0, 1)  # version/flags, one entry
    data[i + 12 : i + 16] = struct.pack(">I", count)
    return bytes(data)


def half(data: bytes) -> bytes:
    return data[: len(data) // 2]


TEXT = b"this is a text file, not an image\n" * 20


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    bomb = png_bomb()
    assert 50_000 < len(bomb) < 1_000_000  # "a few hundred KB"
    return {
        "png": png(),
        "png_bomb": bomb,
        "png_text": TEXT,
        "png_truncated": half(png()),
        "wav": wav(1.0),
        "wav_10h": wav_claiming(10 * 3600),
        "wav_unknown_long": wav_unknown_length(MAX_AUDIO_S + 10),
        "wav_truncated": half(wav(2.0)),
        "flac_10h": flac_claiming(10 * 3600),
        "mp4": mp4(),
        "mp4_frames": mp4_claiming_frames(),
        "mp4_pixels": mp4(2, 240, 320),
        "mp4_truncated": half(mp4()),
    }


# --------------------------------------------------------------------------- servers


def _llm_first_pipeline():
    """The omni test pipeline (its first stage an llm) with voice cloning and a transcription route."""
    p = omni_pipeline()
    info = p.info.with_speech(supports_voice_cloning=True, max_ref_audio_s=20.0)
    recognizer = RecognizerInfo(sample_rate=16000, languages=("en",), max_audio_s=MAX_AUDIO_S)
    return dataclasses.replace(p, info=dataclasses.replace(info, transcription=recognizer))


LIMITS = {"max_image_pixels": MAX_PIXELS, "max_audio_s": MAX_AUDIO_S, "max_num_frames": MAX_FRAMES}


RUNS: list[str] = []  # the request ids the servers below handed to their engine


def counting_runs(srv):
    """The server's engine, its runs noted in RUNS (each still runs as it would)."""
    run = srv.engine.run

    def noted(req):
        RUNS.append(req.request_id)
        return run(req)

    srv.engine.run = noted
    return srv


@pytest.fixture(scope="module")
def llm_srv(server_factory):
    return counting_runs(server_factory(new_engine(_llm_first_pipeline()), **LIMITS))


@pytest.fixture(scope="module")
def decoding_srv(server_factory):
    """Chat media to a pipeline whose first stage is not an llm: the server decodes it."""
    return counting_runs(server_factory(new_engine(image_pipeline()), **LIMITS))


def rss() -> int:
    return psutil.Process().memory_info().rss


def bounded(call):
    """Run one request; returns the response after checking that no engine run started for it (refused before any
    model work) and the RSS growth."""
    before, runs = rss(), len(RUNS)
    r = call()
    grew = rss() - before
    assert RUNS[runs:] == [], "the request reached the engine"
    assert grew < RSS_BUDGET, f"RSS grew by {grew >> 20} MiB"
    return r


def expect(r, status: int, param: str, words: str = "") -> None:
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["param"] == param, err
    assert words in err["message"], err


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# what each hostile file is expected to answer: (status, words in the message)
IMAGE_CASES = {
    "png_bomb": (413, "pixels, above this server's limit of 65536"),
    "png_text": (400, "not a decodable image"),
    "png_truncated": (400, "truncated"),
}
AUDIO_CASES = {
    "wav_10h": (400, "declares 36000.0 s"),
    "flac_10h": (400, "declares 36000.0 s"),
    "wav_unknown_long": (400, "decodes to more than"),
    "wav_truncated": (400, "truncated"),
}
VIDEO_CASES = {
    "mp4_frames": (413, "1000000000 frames"),
    "mp4_pixels": (413, "320x240"),
    "mp4_truncated": (400, "not a decodable video"),
}
WRONG_MIME = (415, "which is not")


# --------------------------------------------------------------------------- chat parts


def chat_part(kind: str, data: bytes, mime: str) -> dict:
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}
    return {"type": kind, kind: {"url": data_url(data, mime)}}


def chat(srv, part: dict):
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}, part]}],
        "modalities": ["text"] if srv.engine.pipeline.name == "test_omni" else None,
    }
    body = {k: v for k, v in body.items() if v is not None}
    return srv.client().post("/v1/chat/completions", json=body)


CHAT_CASES = (
    [("image_url", f, "image/png", c) for f, c in IMAGE_CASES.items()]
    + [("audio_url", f, "audio/wav", c) for f, c in AUDIO_CASES.items()]
    + [("input_audio", f, "audio/wav", c) for f, c in AUDIO_CASES.items()]
    + [("video_url", f, "video/mp4", c) for f, c in VIDEO_CASES.items()]
    + [
        ("image_url", "png", "audio/wav", WRONG_MIME),
        ("audio_url", "wav", "image/png", WRONG_MIME),
        ("video_url", "mp4", "text/plain", WRONG_MIME),
    ]
)


@pytest.mark.parametrize("server", ["llm_srv", "decoding_srv"])
@pytest.mark.parametrize("kind, name, mime, expected", CHAT_CASES, ids=[f"{k}-{n}-{m}" for k, n, m, _ in CHAT_CASES])
def test_chat_parts(request, server, files, kind, name, mime, expected):
    srv = request.getfixturevalue(server)
    r = bounded(lambda: chat(srv, chat_part(kind, files[name], mime)))
    expect(r, expected[0], f"messages[0].content[1].{kind}", expected[1])


def test_valid_chat_parts_pass(llm_srv, decoding_srv, files):
    runs = len(RUNS)
    for kind, name, mime in (
        ("image_url", "png", "image/png"),
        ("audio_url", "wav", "audio/wav"),
        ("input_audio", "wav", "audio/wav"),
        ("video_url", "mp4", "video/mp4"),
    ):
        assert chat(llm_srv, chat_part(kind, files[name], mime)).status_code == 200, kind
    assert chat(decoding_srv, chat_part("image_url", files["png"], "image/png")).status_code == 200
    assert len(RUNS) == runs + 5  # each valid one reached its engine (what bounded() sees for none of the above)


# --------------------------------------------------------------------------- images edits, video references


@pytest.mark.parametrize(
    "name, mime, expected", [*[(n, "image/png", c) for n, c in IMAGE_CASES.items()], ("png", "text/plain", WRONG_MIME)]
)
def test_image_uploads(llm_srv, files, name, mime, expected):
    c = llm_srv.client()
    r = bounded(
        lambda: c.post(
            "/v1/images/edits", data={"prompt": "x", "size": "32x32"}, files={"image": ("in.png", files[name], mime)}
        )
    )
    expect(r, expected[0], "image", expected[1])
    r = bounded(
        lambda: c.post(
            "/v1/images/edits", json={"prompt": "x", "size": "32x32", "image_url": data_url(files[name], mime)}
        )
    )
    expect(r, expected[0], "image_url", expected[1])
    r = bounded(
        lambda: c.post(
            "/v1/videos",
            data={"prompt": "x", "size": "32x32"},
            files={"input_reference": ("in.png", files[name], mime)},
        )
    )
    expect(r, expected[0], "input_reference", expected[1])
    r = bounded(
        lambda: c.post(
            "/v1/videos", json={"prompt": "x", "size": "32x32", "image_reference": data_url(files[name], mime)}
        )
    )
    expect(r, expected[0], "image_reference", expected[1])


def test_valid_image_uploads_pass(llm_srv, files):
    c = llm_srv.client()
    r = c.post(
        "/v1/images/edits",
        data={"prompt": "x", "size": "32x32"},
        files={"image": ("in.png", files["png"], "image/png")},
    )
    assert r.status_code == 200, r.text
    r = c.post(
        "/v1/videos",
        data={"prompt": "x", "size": "32x32", "num_frames": "2"},
        files={"input_reference": ("in.png", files["png"], "image/png")},
    )
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------- speech ref_audio, voices, transcriptions


@pytest.mark.parametrize(
    "name, mime, expected", [*[(n, "audio/wav", c) for n, c in AUDIO_CASES.items()], ("wav", "image/png", WRONG_MIME)]
)
def test_audio_uploads(llm_srv, files, name, mime, expected):
    c = llm_srv.client()
    r = bounded(
        lambda: c.post(
            "/v1/audio/speech", json={"input": "hi", "ref_audio": data_url(files[name], mime), "ref_text": "hello"}
        )
    )
    expect(r, expected[0], "ref_audio", expected[1])
    r = bounded(
        lambda: c.post(
            "/v1/audio/voices", data={"name": "v1", "text": "hello"}, files={"audio": ("clip.wav", files[name], mime)}
        )
    )
    expect(r, expected[0], "audio", expected[1])
    r = bounded(
        lambda: c.post(
            "/v1/audio/transcriptions",
            data={"model": llm_srv.state.model_name},
            files={"file": ("clip.wav", files[name], mime)},
        )
    )
    expect(r, expected[0], "file", expected[1])


def test_valid_audio_uploads_pass(llm_srv, files):
    c = llm_srv.client()
    r = c.post(
        "/v1/audio/speech",
        json={
            "input": "hi",
            "ref_audio": data_url(files["wav"], "audio/wav"),
            "ref_text": "hello",
            "response_format": "pcm",
        },
    )
    assert r.status_code == 200, r.text
    r = c.post(
        "/v1/audio/voices",
        data={"name": "ok1", "text": "hello"},
        files={"audio": ("clip.wav", files["wav"], "audio/wav")},
    )
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------- media fetched by URL


@pytest.fixture(scope="module")
def origin(files):
    """A loopback HTTP server answering /NAME?type=T with the hostile-file fixture NAME as Content-Type T."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    def media(request):
        return Response(files[request.path_params["name"]], media_type=request.query_params["type"])

    with serve_app(Starlette(routes=[Route("/{name}", media)])) as srv:
        yield srv.url


def url_entries(srv, origin: str, name: str, declared: str):
    """(field, response) of each entry point taking a URL of file ``name`` served as ``declared``."""
    from urllib.parse import quote

    c = srv.client()
    url = f"{origin}/{name}?type={quote(declared)}"
    kind = {"png": "image_url", "wav": "audio_url", "mp4": "video_url"}[name]
    yield f"messages[0].content[1].{kind}", chat(srv, {"type": kind, kind: {"url": url}})
    if kind == "image_url":
        yield "image_url", c.post("/v1/images/edits", json={"prompt": "x", "size": "32x32", "image_url": url})
        yield (
            "image_reference",
            c.post("/v1/videos", json={"prompt": "x", "size": "32x32", "num_frames": 2, "image_reference": url}),
        )
    if kind == "audio_url":
        yield (
            "ref_audio",
            c.post(
                "/v1/audio/speech",
                json={"input": "hi", "ref_audio": url, "ref_text": "hello", "response_format": "pcm"},
            ),
        )


@pytest.mark.parametrize(
    "name, declared",
    [
        ("png", "text/html"),
        ("png", "audio/wav"),
        ("wav", "image/png"),
        ("wav", "text/plain; charset=utf-8"),
        ("mp4", "image/gif"),
    ],
)
def test_a_fetched_url_of_the_wrong_content_type_is_415(llm_srv, decoding_srv, origin, name, declared):
    for srv in (llm_srv, decoding_srv) if name == "png" else (llm_srv,):  # chat parts decoded by the server too
        for field, r in url_entries(
            srv, origin, name, declared
        ):  # the bytes are the valid file: the declared type is refused
            expect(r, *WRONG_MIME[:1], field, f"declared as {declared.split(';')[0]!r}, which is not")


@pytest.mark.parametrize(
    "name, declared",
    [("png", "image/png"), ("png", "application/octet-stream"), ("wav", "audio/wav"), ("mp4", "video/mp4")],
)
def test_a_fetched_url_of_its_kind_or_a_generic_type_passes(llm_srv, origin, name, declared):
    for field, r in url_entries(llm_srv, origin, name, declared):
        assert r.status_code == 200, (field, r.text)


# --------------------------------------------------------------------------- JSON nesting


DEEP = 100_000


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/chat/completions", lambda deep: f'{{"messages": {deep}}}', "messages"),
        ("/v1/images/generations", lambda deep: f'{{"prompt": "x", "extra_body": {deep}}}', "extra_body"),
        ("/v1/images/edits", lambda deep: f'{{"prompt": "x", "image_url": {deep}}}', "image_url"),
        ("/v1/audio/speech", lambda deep: f'{{"input": "x", "extra_body": {{"a": {deep}}}}}', "extra_body"),
        ("/v1/videos", lambda deep: f'{{"prompt": "x", "extra_params": {deep}}}', "extra_params"),
        ("/v1/chat/completions", lambda deep: deep, None),
    ],
)
def test_deep_json_bodies(llm_srv, path, body, field):
    deep = "[" * DEEP + "]" * DEEP
    for headers in ({"content-type": "application/json"}, {}):  # FastAPI parses a body without a type as JSON
        r = bounded(lambda: llm_srv.client().post(path, content=body(deep), headers=headers))
        expect(r, 400, field, "nested more than")
        assert error_of(r)["code"] == "json_too_deep"


def test_deep_json_in_a_form_field(llm_srv):
    deep = '{"a": ' * 200 + "1" + "}" * 200
    r = bounded(
        lambda: llm_srv.client().post(
            "/v1/videos",
            data={"prompt": "x", "extra_params": deep},
            files={"input_reference": ("in.png", png(), "image/png")},
        )
    )
    expect(r, 400, "extra_params", "nested more than")


def test_json_depth_scanner():
    assert json_too_deep(b'{"a": [1, {"b": "[[[[[[["}]}', 3) is None  # brackets in strings do not count
    assert json_too_deep(b'{"a": "\\"[[[[", "b": [[[[1]]]]}', 3) == "b"  # nor after an escaped quote
    assert json_too_deep(b'{"a": "x\\\\", "b": [[[[1]]]]}', 3) == "b"  # a string ending in an escaped backslash
    assert json_too_deep("[" * 5 + "]" * 5, 4) == ""
    assert json_too_deep(b'{"x": 1, "k": {"y": [[1]]}}', 4) is None
    assert json_too_deep(b'{"k": {"y": [[[1]]]}}', 4) == "k"
    with pytest.raises(ProtocolError) as e:
        parse('{"type": "session.update", "session": ' + "[" * DEEP + "]" * DEEP + "}", 8 << 20)
    assert e.value.code == "json_too_deep" and e.value.param == "session"
