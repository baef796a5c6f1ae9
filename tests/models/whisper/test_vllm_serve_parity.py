"""Parity with plain ``vllm serve``: the same tiny Whisper folder behind vLLM's own OpenAI server (its
``/v1/audio/transcriptions`` and ``/v1/audio/translations``) and behind omnistage, the same requests from
the official ``openai`` client, the same text — short clips, other languages, translation, a 65 s
clip that both cut into windows at the same quiet points, and a clip whose language both detect.

verbose_json: ``vllm serve`` is started with omnistage's Whisper timestamp rules as a logits processor
(``--logits-processors``, inert for requests that do not ask) and asked for them per request
(``vllm_xargs``); its segments — start, end, text, tokens, avg_logprob — equal omnistage's, window by window,
but for omnistage's two documented differences (server/segments.py): a time past the window's audio is held at
the window's end, and a window without a timestamp pair (no segment from ``vllm serve``) is one segment.

Not compared: ``prompt`` (vLLM writes ``<|prev|>``, not a Whisper token; omnistage ``<|startofprev|>``),
``text`` (vLLM 0.32 answers it with its JSON body; OpenAI and omnistage with the plain text), ``seek`` (vLLM:
the window's start in whole seconds; omnistage: in 10 ms frames, as openai-whisper) and the stream (vLLM streams
chat-completion-style chunks, omnistage OpenAI's ``transcript.text.*`` events).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import numpy as np
import openai
import pytest

from omnistage.models.shared.whisper import TIMESTAMP_RULES
from omnistage.models.shared.whisper.prompt import TIMESTAMPS_ARG
from omnistage.testing.server import free_port, serve_engine
from tests.models.asr_cases import RATE, as_heard
from tests.models.whisper.cases import ENGINE
from tests.models.whisper.test_http import LONG, OTHERS, SHORT, WINDOW_S

pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MAX_TOKENS = 12
MODEL = "tiny-whisper"


@pytest.fixture(scope="module")
def vllm_serve(tiny_model, tmp_path_factory):
    """``vllm serve`` (its api_server module: the ``vllm`` script needs the package named vllm) in a child,
    with the timestamp rules loaded (the child imports them from omnistage: PYTHONPATH as this process's)."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "log.txt"
    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model("whisper")),
        "--served-model-name",
        MODEL,
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "448",
        "--kv-cache-memory-bytes",
        str(64 << 20),
        "--enforce-eager",
        "--logits-processors",
        TIMESTAMP_RULES,
    ]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve not up in time:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def omnistage_serve(tiny_model, vllm_serve):
    from omnistage import AsyncOmni

    with serve_engine(AsyncOmni(tiny_model("whisper"), **ENGINE), ready_timeout=300, served_model_name=MODEL) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)


CASES = [
    ("transcriptions", SHORT, "en", "json"),
    ("transcriptions", SHORT, "de", "json"),
    ("transcriptions", OTHERS[0], "es", "json"),
    ("translations", SHORT, "fr", "json"),
    ("transcriptions", LONG, "en", "json"),
    ("transcriptions", OTHERS[1], "en", "json"),
    # no language: both detect it (the tiny model hears "id", one of the 57 languages vLLM allows)
    ("transcriptions", OTHERS[1], None, "json"),
]


@pytest.mark.parametrize("route, data, language, fmt", CASES)
def test_same_text_as_vllm_serve(vllm_serve, omnistage_serve, route, data, language, fmt):
    def ask(client):
        api = getattr(client.audio, route)
        out = api.create(
            model=MODEL,
            file=("clip.wav", data, "audio/wav"),
            response_format=fmt,
            extra_body={"max_completion_tokens": MAX_TOKENS, **({"language": language} if language else {})},
        )
        return out if isinstance(out, str) else out.text

    theirs, ours = ask(vllm_serve), ask(omnistage_serve)
    assert theirs.strip()  # a case with text in it
    assert ours == theirs


VERBOSE_TOKENS = 24
VERBOSE = [
    ("transcriptions", SHORT, "en"),
    ("transcriptions", OTHERS[0], "es"),
    ("translations", SHORT, "fr"),
    ("transcriptions", OTHERS[2], "en"),
    ("transcriptions", LONG, "en"),
]


def window_bounds(data: bytes) -> list[tuple[float, float]]:
    """(start s, end s) of each window, as both servers cut the clip (vLLM's split_audio)."""
    from vllm.multimodal.audio import split_audio

    samples = as_heard(data)
    pieces = split_audio(samples, RATE, WINDOW_S, 1, 1600) if samples.size > WINDOW_S * RATE else [samples]
    ends = np.cumsum([p.size / RATE for p in pieces])
    return [(end - p.size / RATE, end) for p, end in zip(pieces, ends)]


@pytest.fixture(scope="module")
def verbose_pairs(vllm_serve, omnistage_serve):
    """Per VERBOSE case: (vllm serve's segments, omnistage's segments, the windows' bounds)."""

    def ask(client, route, data, language, **extra):
        api = getattr(client.audio, route)
        return api.create(
            model=MODEL,
            file=("clip.wav", data, "audio/wav"),
            response_format="verbose_json",
            extra_body={"max_completion_tokens": VERBOSE_TOKENS, "language": language, **extra},
        ).segments

    rules = json.dumps({TIMESTAMPS_ARG: 1})  # (vLLM reads the form field as JSON)
    return [
        (ask(vllm_serve, *case, vllm_xargs=rules), ask(omnistage_serve, *case), window_bounds(case[1]))
        for case in VERBOSE
    ]


def test_verbose_json_segments_as_vllm_serve(verbose_pairs):
    compared = held = 0
    for theirs, ours, bounds in verbose_pairs:
        for k, (start, end) in enumerate(bounds):
            mine = [s for s in ours if s.seek == round(start * 100)]
            their = [s for s in theirs if s.seek == int(start)]
            if not their:  # vllm serve: no segment for a window without a timestamp pair
                assert [(s.start, s.end) for s in mine] == [(pytest.approx(start), pytest.approx(end))]
                continue
            assert [(s.start, s.end, s.text, s.tokens, s.avg_logprob) for s in mine] == [
                (
                    pytest.approx(min(s.start, end)),
                    pytest.approx(min(s.end, end)),
                    s.text,
                    s.tokens,
                    pytest.approx(s.avg_logprob, abs=1e-4),
                )
                for s in their
            ], k
            compared += len(their)
            held += sum(s.end > end for s in their)
        assert sum(len([s for s in ours if s.seek == round(a * 100)]) for a, _ in bounds) == len(ours)
    assert compared >= 4 and held >= 1  # (whole-window fallbacks are allowed, not required)
