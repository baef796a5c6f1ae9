"""A Llasa-style codec_tts folder (Llama LM + XCodec2) through the real HTTP server (``omnistage serve``
subprocess): voice cloning with ``ref_audio`` and registered voices (persisted across a restart), true
streaming in every response_format, bad input, and load (64 concurrent streams: each completes or gets
a clean 503 with Retry-After, no process dies, memory comes back).

Engine-level exactness against the Llasa recipe is in tests/models/codec_tts/test_llasa_vllm.py; here a
cloned request must equal the same request made with the registered voice, streamed bodies must equal
the whole response, and concurrent requests their solo runs."""

from __future__ import annotations

import asyncio
import base64
import io
import time

import av
import httpx
import numpy as np
import psutil
import pytest
import soundfile

from omnistage.testing.server import ServeProcess
from tests.server.test_audio_stream_encoder import LAME_DELAY, decode, mp3_at_once

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

FRAMES = 40  # one token per XCodec2 frame, 320 samples per frame at 16 kHz
KNOBS = {"temperature": 0, "max_tokens": FRAMES, "min_tokens": FRAMES}
REF_TEXT = "a reference clip, spoken by someone."


def wav_bytes(seconds: float, freq: float, seed: int, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    audio = 0.2 * np.sin(2 * np.pi * freq * t) + 0.05 * np.random.default_rng(seed).standard_normal(t.size)
    buf = io.BytesIO()
    soundfile.write(buf, audio.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


CLIP = wav_bytes(1.2, 220, seed=1)
CLIP_URL = "data:audio/wav;base64," + base64.b64encode(CLIP).decode()


def launch(model, storage, log) -> ServeProcess:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNISTAGE_SERVER_STORAGE__PATH", str(storage))
        return ServeProcess.launch(
            [
                str(model),
                "--served-model-name",
                "tiny-llasa",
                "--max-pending",
                "24",
                "--stage-overrides",
                '{"0": {"max_model_len": 512, "dtype": "float32"}}',
            ],
            log,
        )


@pytest.fixture(scope="module")
def paths(tiny_model, tmp_path_factory):
    return tiny_model("llasa"), tmp_path_factory.mktemp("llasa-storage"), tmp_path_factory.mktemp("llasa-log")


@pytest.fixture(scope="module")
def server(paths):
    model, storage, logs = paths
    srv = launch(model, storage, logs / "server.log")
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


def speak(url: str, **body) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/audio/speech", json={"input": "hello world", "response_format": "pcm", **KNOBS, **body}, timeout=180
    )


def pcm(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    return np.frombuffer(resp.content, dtype="<i2").astype(np.int32)


def same_samples(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal PCM16 up to one level. XCodec2's decode differs by float32 rounding with the batch it runs in
    (measured: one window decoded alone vs beside three others, max 2.9e-7, 3-22 of 3840-9920 samples one level
    apart), and a request's blocks are decoded one or several per call depending on when the LM's tokens
    arrive: two runs of one request need not be bit-equal even alone. A dropped, repeated or misplaced sample
    is many levels off."""
    return a.shape == b.shape and int(np.abs(a - b).max(initial=0)) <= 1


def error(resp: httpx.Response) -> dict:
    return resp.json()["error"]


def test_register_list_use_and_delete_a_cloned_voice(server):
    url = server.url
    r = httpx.post(
        f"{url}/v1/audio/voices",
        data={"name": "anna", "text": REF_TEXT},
        files={"audio": ("anna.wav", CLIP, "audio/wav")},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "anna" and r.json()["duration_s"] == pytest.approx(1.2, abs=1e-3)
    listed = httpx.get(f"{url}/v1/audio/voices").json()
    assert "anna" in listed["voices"] and {"id": "anna", "type": "cloned"}.items() <= listed["data"][-1].items()
    by_name = pcm(speak(url, voice="anna"))
    inline = pcm(speak(url, ref_audio=CLIP_URL, ref_text=REF_TEXT))
    bare_b64 = pcm(speak(url, ref_audio=base64.b64encode(CLIP).decode(), ref_text=REF_TEXT))
    zero_shot = pcm(speak(url))
    assert by_name.shape == (FRAMES * 320,)
    assert same_samples(by_name, inline) and same_samples(inline, bare_b64)  # same clip, same text, greedy
    assert not same_samples(by_name, zero_shot)  # the reference changed the speech
    assert (
        httpx.post(
            f"{url}/v1/audio/voices",
            data={"name": "anna", "text": REF_TEXT},
            files={"audio": ("a.wav", CLIP, "audio/wav")},
        ).status_code
        == 409
    )
    assert httpx.delete(f"{url}/v1/audio/voices/anna").json()["deleted"] is True
    assert "anna" not in httpx.get(f"{url}/v1/audio/voices").json()["voices"]
    assert httpx.delete(f"{url}/v1/audio/voices/anna").status_code == 404
    assert error(speak(url, voice="anna"))["param"] == "voice"


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac", "mp3"])
def test_streamed_formats_arrive_in_pieces_and_equal_the_whole(server, fmt):
    body = {
        "input": "good morning",
        "ref_audio": CLIP_URL,
        "ref_text": REF_TEXT,
        **KNOBS,
        "initial_codec_chunk_frames": 2,
    }  # a first block of 2 frames, then the folder's 8
    with httpx.Client(base_url=server.url, timeout=180) as c:
        # the same request and block schedule, whole: what every streamed body must carry
        whole = pcm(c.post("/v1/audio/speech", json={**body, "response_format": "pcm"}))
        with c.stream("POST", "/v1/audio/speech", json={**body, "response_format": fmt, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith(
                f"audio/{'mpeg' if fmt == 'mp3' else fmt}"
            )
            reads = list(r.iter_raw())
    assert len(reads) >= 3  # several chunks, not one body at the end
    data = b"".join(reads)
    if fmt == "pcm":
        assert len(reads[0]) == 2 * 320 * 2  # the first chunk: initial_codec_chunk_frames=2 frames of PCM16
        got = np.frombuffer(data, dtype="<i2").astype(np.int32)
    elif fmt == "wav":
        assert data[:4] == b"RIFF" and len(reads[0]) == 44 + 2 * 320 * 2  # streaming header + the first chunk
        got = np.frombuffer(data[44:], dtype="<i2").astype(np.int32)
    else:
        with av.open(io.BytesIO(data)) as container:
            decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
        if fmt == "mp3":  # lossy: equal to the whole clip encoded at once, after the encoder's delay
            ref = decode(mp3_at_once(whole.astype(np.int16), 64000, 16000))
            assert len(ref) == len(whole) and len(decoded) >= LAME_DELAY + len(ref)
            # (the PCM under it may be one level off the whole's, see same_samples: measured on a 0.8 s clip,
            # 15 samples one level off move LAME's decoded output by at most 8.4e-4, mean 4e-5)
            diff = np.abs(decoded[LAME_DELAY : LAME_DELAY + len(ref)] - ref)
            assert diff.max() < 2e-3 and diff.mean() < 2e-4
            return
        got = decoded.astype(np.int32)
    assert same_samples(got, whole)  # lossless formats carry the very samples


def test_streamed_body_equals_whole_body_with_the_same_schedule(server):
    body = {"input": "the lazy dog", **KNOBS}
    with httpx.Client(base_url=server.url, timeout=180) as c:
        whole = pcm(c.post("/v1/audio/speech", json={**body, "response_format": "pcm"}))
        streamed = c.post("/v1/audio/speech", json={**body, "response_format": "flac", "stream": True})
        sse = c.post("/v1/audio/speech", json={**body, "stream": True, "stream_format": "sse"})
    with av.open(io.BytesIO(streamed.content)) as container:
        flac = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]).astype(np.int32)
    assert same_samples(flac, whole)  # flac is lossless: the very samples of the whole response
    events = [line[6:] for line in sse.text.splitlines() if line.startswith("data: ")]
    import json

    deltas = [json.loads(e) for e in events if "speech.audio.delta" in e]
    sse_pcm = np.frombuffer(b"".join(base64.b64decode(d["audio"]) for d in deltas), dtype="<i2").astype(np.int32)
    assert len(deltas) >= 3 and same_samples(sse_pcm, whole)


def test_eight_concurrent_mixed_voices_equal_their_solo_runs(server):
    url = server.url
    clip2 = "data:audio/wav;base64," + base64.b64encode(wav_bytes(0.8, 410, seed=4)).decode()
    httpx.post(
        f"{url}/v1/audio/voices",
        data={"name": "bob", "text": REF_TEXT},
        files={"audio": ("bob.wav", wav_bytes(1.0, 300, seed=3), "audio/wav")},
    ).raise_for_status()
    bodies = [
        {"voice": "bob"},
        {},
        {"ref_audio": CLIP_URL, "ref_text": REF_TEXT},
        {"input": "good morning"},
        {"ref_audio": clip2, "ref_text": REF_TEXT, "input": "the lazy dog"},
        {"voice": "bob", "input": "i am fine"},
        {"input": "the quick brown fox"},
        {"ref_audio": clip2, "ref_text": REF_TEXT},
    ]

    async def together():
        async with httpx.AsyncClient(timeout=300) as c:
            return await asyncio.gather(
                *(
                    c.post(
                        f"{url}/v1/audio/speech", json={"input": "hello world", "response_format": "pcm", **KNOBS, **b}
                    )
                    for b in bodies
                )
            )

    for body, resp in zip(bodies, asyncio.run(together())):
        assert same_samples(pcm(resp), pcm(speak(url, **body)))


@pytest.mark.parametrize(
    "body, param",
    [
        ({"voice": "nobody"}, "voice"),
        (
            {"ref_audio": "data:audio/wav;base64," + base64.b64encode(b"not audio at all").decode(), "ref_text": "x"},
            "ref_audio",
        ),
        ({"ref_audio": "%%%not base64", "ref_text": "x"}, "ref_audio"),
        (
            {"ref_audio": "data:audio/wav;base64," + base64.b64encode(wav_bytes(31, 200, 0)).decode(), "ref_text": "x"},
            "ref_audio",
        ),  # longer than max_ref_audio_s (30 s)
        ({"ref_audio": CLIP_URL}, "ref_text"),
        ({"ref_text": "x"}, "ref_text"),
        ({"response_format": "opus"}, "response_format"),
        ({"response_format": "aac", "stream": True}, "response_format"),
        ({"language": "de"}, "language"),
        ({"instructions": "whisper"}, "instructions"),
        ({"initial_codec_chunk_frames": 0, "stream": True}, "initial_codec_chunk_frames"),
    ],
)
def test_bad_requests_are_400_naming_the_field(server, body, param):
    resp = speak(server.url, **body)
    assert resp.status_code == 400, resp.text
    assert error(resp)["param"] == param


@pytest.mark.parametrize(
    "data, files, param",
    [
        ({"name": "x y", "text": REF_TEXT}, {"audio": ("a.wav", CLIP, "audio/wav")}, "name"),
        ({"name": "carl"}, {"audio": ("a.wav", CLIP, "audio/wav")}, "text"),
        ({"name": "carl", "text": REF_TEXT}, {"audio": ("a.wav", b"garbage", "audio/wav")}, "audio"),
        ({"name": "carl", "text": REF_TEXT}, {"audio": ("a.wav", wav_bytes(31, 200, 0), "audio/wav")}, "audio"),
    ],
)
def test_bad_voice_uploads_are_400_naming_the_field(server, data, files, param):
    resp = httpx.post(f"{server.url}/v1/audio/voices", data=data, files=files, timeout=60)
    assert resp.status_code == 400, resp.text
    assert error(resp)["param"] == param


def _rss_mb(proc: psutil.Process) -> float:
    return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20


def test_64_concurrent_streams_complete_or_get_a_clean_503(server):
    proc = psutil.Process(server.proc.pid)
    pids = {p.pid for p in [proc, *proc.children(recursive=True)]}
    body = {
        "input": "good morning",
        "response_format": "pcm",
        "stream": True,
        **KNOBS,
        "max_tokens": 24,
        "min_tokens": 24,
    }

    async def one(c: httpx.AsyncClient, i: int) -> tuple[int, int, str | None]:
        b = {**body, **({"ref_audio": CLIP_URL, "ref_text": REF_TEXT} if i % 2 else {})}
        async with c.stream("POST", f"{server.url}/v1/audio/speech", json=b) as r:
            data = b"".join([chunk async for chunk in r.aiter_raw()])
            return r.status_code, len(data), r.headers.get("retry-after")

    async def load() -> list[tuple[int, int, str | None]]:
        async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as c:
            return await asyncio.gather(*(one(c, i) for i in range(64)))

    asyncio.run(load())  # warm-up round: first-request costs and allocator pools are not a leak
    before = _rss_mb(proc)
    results = asyncio.run(load())
    ok = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 503]
    assert len(ok) + len(refused) == 64, [r[0] for r in results]
    assert ok and all(n == 24 * 320 * 2 for _, n, _ in ok)  # every admitted stream is complete
    assert all(retry is not None and int(retry) > 0 for _, _, retry in refused)
    assert server.proc.poll() is None and {p.pid for p in [proc, *proc.children(recursive=True)]} == pids
    time.sleep(2)  # let finished requests' buffers go
    after = _rss_mb(proc)
    assert after <= 1.10 * before, (before, after)
    assert httpx.get(f"{server.url}/health").json()["in_flight"] == 0


def test_registered_voices_survive_a_restart(server, paths):
    model, storage, logs = paths
    httpx.post(
        f"{server.url}/v1/audio/voices",
        data={"name": "dora", "text": REF_TEXT},
        files={"audio": ("d.wav", CLIP, "audio/wav")},
    ).raise_for_status()
    before = pcm(speak(server.url, voice="dora"))
    server.stop()
    again = launch(model, storage, logs / "restarted.log")
    try:
        assert "dora" in httpx.get(f"{again.url}/v1/audio/voices").json()["voices"]
        assert same_samples(pcm(speak(again.url, voice="dora")), before)
    finally:
        again.stop()
