"""The request mix of benchmarks/soak.py: one function per kind of request, each returning ``(kind, ok)`` where
``ok`` says the answer was exactly what that request must get (status, shape, length), and the servers they go
to (``SERVERS``: the tiny fixture folder each server is started on)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

PROMPTS = ["a red cat on a blue chair", "a lighthouse at dusk", "two green apples", "a paper boat", "snowy hills"]
FRAMES = 16  # codec_tts: 2 tokens a frame, 320 samples a frame at 16 kHz
TTS_KNOBS = {"temperature": 0, "max_tokens": 2 * FRAMES, "min_tokens": 2 * FRAMES}
VIDEO = {"size": "48x32", "num_frames": 5, "num_inference_steps": 2, "fps": 8}


@dataclass(frozen=True)
class Server:
    name: str
    build: Callable[[Path], Path]  # writes the folder to serve under a work directory
    args: tuple[str, ...]  # omnistage serve options besides the folder


def _prompt_expand(work: Path) -> Path:
    """A prompt_expand folder over the tiny chat LM and the tiny SD3 image model (vLLM stage + diffusion stage)."""
    from omnistage.testing.tiny import build

    folder = work / "expander"
    folder.mkdir()
    build("chat", work / "chat")
    build("sd3", work / "sd3")
    (folder / "llm").symlink_to(work / "chat")
    (folder / "image").symlink_to(work / "sd3")
    (folder / "omnistage.json").write_text(json.dumps({"pipeline": "prompt_expand"}))
    return folder


def _tiny(name: str) -> Callable[[Path], Path]:
    def build(work: Path) -> Path:
        from omnistage.testing.tiny import build

        return build(name, work / name)

    return build


SERVERS = {
    "image_chat": Server("image_chat", _prompt_expand, ("--enforce-eager", "--served-model-name", "soak")),
    "speech": Server(
        "speech",
        _tiny("codec_tts"),
        (
            "--enforce-eager",
            "--served-model-name",
            "tiny-tts",
            "--stage-overrides",
            '{"0": {"max_model_len": 512, "dtype": "float32"}}',
        ),
    ),
    "video": Server("video", _tiny("wan"), ("--served-model-name", "tiny-wan")),
}


# ----------------------------------------------------------------------------------------------- image_chat


def image(c: httpx.Client, i: int) -> tuple[str, bool]:
    r = c.post(
        "/v1/images/generations",
        json={
            "prompt": PROMPTS[i % len(PROMPTS)],
            "size": "32x32",
            "seed": i,
            "num_inference_steps": 2,
            "max_tokens": 12,
            "ignore_eos": True,
        },
    )
    return "image", r.status_code == 200 and len(r.json()["data"]) == 1


def chat_stream(c: httpx.Client, i: int) -> tuple[str, bool]:
    body = {
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "modalities": ["text"],
        "max_tokens": 24,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    usage = json.loads(lines[-2][6:]).get("usage") if len(lines) >= 2 else None
    return "chat_stream", r.status_code == 200 and lines[-1] == "data: [DONE]" and usage["completion_tokens"] == 24


def aborted_stream(c: httpx.Client, i: int) -> tuple[str, bool]:
    body = {
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "modalities": ["text"],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        ok = r.status_code == 200
        for n, _ in enumerate(r.iter_lines()):
            if n >= 2:
                break  # leaving the block closes the connection mid-stream
    return "aborted_stream", ok


BAD: list[tuple[str, dict, int]] = [
    ("/v1/images/generations", {"json": {"prompt": "x", "size": "8192x8192"}}, 400),  # --max-image-pixels
    ("/v1/images/generations", {"json": {"prompt": "x", "size": "30x30"}}, 400),  # not a multiple of the patch
    ("/v1/images/generations", {"json": {"prompt": "x", "num_inference_steps": 500}}, 400),  # --max-inference-steps
    ("/v1/images/generations", {"json": {"prompt": ""}}, 400),
    ("/v1/images/generations", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400),
    ("/v1/images/edits", {"json": {"prompt": "x", "image_url": "data:image/png;base64,@@@"}}, 400),
    ("/v1/images/edits", {"json": {"prompt": "x", "image_url": "file:///etc/passwd"}}, 400),
    ("/v1/chat/completions", {"json": {"messages": []}}, 400),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}}, 400),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}}, 404),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}}, 400),
    ("/v1/audio/speech", {"json": {"input": "x"}}, 400),  # this model makes no audio
    ("/v1/videos/video_0000/content", {"method": "GET"}, 404),
]
BAD_SPEECH: list[tuple[str, dict, int]] = [
    ("/v1/audio/speech", {"json": {"input": "hi", "voice": "tenor", **TTS_KNOBS}}, 400),
    ("/v1/audio/speech", {"json": {"input": "   ", **TTS_KNOBS}}, 400),
    ("/v1/audio/speech", {"json": {"input": "hi", "speed": 1.5, **TTS_KNOBS}}, 400),
    ("/v1/audio/speech", {"json": {"input": "hi", "response_format": "ogg-vorbis"}}, 400),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}}, 404),
]
BAD_VIDEO: list[tuple[str, dict, int]] = [
    ("/v1/videos/sync", {"json": {"prompt": "x", **VIDEO, "num_frames": 6}}, 400),  # not 4k+1
    ("/v1/videos/sync", {"json": {"prompt": "x", **VIDEO, "size": "8192x8192"}}, 400),
    ("/v1/videos/sync", {"json": {"prompt": "", **VIDEO}}, 400),
    ("/v1/videos/video_does_not_exist", {"method": "GET"}, 404),
    ("/v1/videos/video_does_not_exist/content", {"method": "GET"}, 404),
]


def _bad(table: list[tuple[str, dict, int]], kind: str) -> Callable[[httpx.Client, int], tuple[str, bool]]:
    def bad(c: httpx.Client, i: int) -> tuple[str, bool]:
        path, kw, status = table[i % len(table)]
        kw = dict(kw)
        r = c.request(kw.pop("method", "POST"), path, **kw)
        return kind, r.status_code == status and set(r.json()) == {"error"}

    bad.__name__ = kind
    return bad


bad_input = _bad(BAD, "bad_input")


# ----------------------------------------------------------------------------------------------- speech


def speech_whole(c: httpx.Client, i: int) -> tuple[str, bool]:
    import io

    import soundfile

    r = c.post(
        "/v1/audio/speech",
        json={
            "input": PROMPTS[i % len(PROMPTS)],
            "voice": ("alto", "bass")[i % 2],
            "response_format": "wav",
            **TTS_KNOBS,
        },
    )
    if r.status_code != 200:
        return "speech_whole", False
    audio, rate = soundfile.read(io.BytesIO(r.content), dtype="float32")
    return "speech_whole", rate == 16000 and audio.shape == (FRAMES * 320,)


def speech_stream(c: httpx.Client, i: int) -> tuple[str, bool]:
    body = {
        "input": PROMPTS[i % len(PROMPTS)],
        "voice": ("alto", "bass")[i % 2],
        "response_format": "pcm",
        "stream": True,
        **TTS_KNOBS,
    }
    with c.stream("POST", "/v1/audio/speech", json=body) as r:
        size = sum(len(piece) for piece in r.iter_raw())
    return "speech_stream", r.status_code == 200 and size == FRAMES * 320 * 2


# ----------------------------------------------------------------------------------------------- video


def _mp4_frames(data: bytes) -> tuple[int, int, int]:
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        frames = [f for f in container.decode(container.streams.video[0])]
        return len(frames), frames[0].height, frames[0].width


def video_sync(c: httpx.Client, i: int) -> tuple[str, bool]:
    r = c.post("/v1/videos/sync", json={"prompt": PROMPTS[i % len(PROMPTS)], "seed": i, **VIDEO})
    return "video_sync", (
        r.status_code == 200 and r.headers["content-type"] == "video/mp4" and _mp4_frames(r.content) == (5, 32, 48)
    )


def video_job(c: httpx.Client, i: int) -> tuple[str, bool]:
    """An async job: create (multipart), poll to completed, download, delete (the stored MP4 goes too)."""
    form = {"prompt": PROMPTS[i % len(PROMPTS)], "seed": str(i), **{k: str(v) for k, v in VIDEO.items()}}
    job = c.post("/v1/videos", files={k: (None, v) for k, v in form.items()})
    if job.status_code != 200:
        return "video_job", False
    vid, deadline = job.json()["id"], time.monotonic() + 120
    while (state := c.get(f"/v1/videos/{vid}").json())["status"] not in ("completed", "failed"):
        if time.monotonic() > deadline:
            return "video_job (no end in 120 s)", False
        time.sleep(0.05)
    content = c.get(f"/v1/videos/{vid}/content")
    ok = state["status"] == "completed" and content.status_code == 200 and _mp4_frames(content.content) == (5, 32, 48)
    deleted = c.delete(f"/v1/videos/{vid}").status_code == 200 and c.get(f"/v1/videos/{vid}").status_code == 404
    return "video_job", ok and deleted


# ----------------------------------------------------------------------------------------------- the mix

Request = Callable[[httpx.Client, int], tuple[str, bool]]

# per 20 requests: which server each slot goes to (the order is shuffled by the caller)
MIX: dict[str, list[Request]] = {
    "image_chat": [image] * 6 + [chat_stream] * 6 + [aborted_stream] * 3 + [bad_input] * 5,
    "speech": [speech_whole] * 8 + [speech_stream] * 8 + [_bad(BAD_SPEECH, "speech_bad_input")] * 4,
    "video": [video_sync] * 10 + [video_job] * 4 + [_bad(BAD_VIDEO, "video_bad_input")] * 6,
}
# with several servers, how many of every 20 requests each server gets (video requests are the slowest)
SHARE = {"image_chat": 9, "speech": 7, "video": 4}
