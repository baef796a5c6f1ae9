"""Parity with plain ``vllm serve``: the same tiny Whisper folder behind vLLM's own OpenAI server (its
``/v1/audio/transcriptions`` and ``/v1/audio/translations``) and behind omnistage, the same requests from
the official ``openai`` client, the same text — short clips, other languages, translation, a 65 s
clip that both cut into windows at the same quiet points, and a clip whose language both detect.

Not compared: ``prompt`` (vLLM writes ``<|prev|>``, not a Whisper token; omnistage ``<|startofprev|>``),
``verbose_json`` (vLLM decodes with timestamp tokens; omnistage gives one segment per window), ``text``
(vLLM 0.32 answers it with its JSON body; OpenAI and omnistage with the plain text) and the stream (vLLM streams chat-completion-style chunks, omnistage OpenAI's ``transcript.text.*`` events).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from omnistage.testing.server import free_port, serve_engine
from tests.e2e.test_transcriptions_http import LONG, OTHERS, SHORT
from tests.models.whisper.cases import ENGINE

pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MAX_TOKENS = 12
MODEL = "tiny-whisper"


@pytest.fixture(scope="module")
def vllm_serve(tiny_model, tmp_path_factory):
    """``vllm serve`` (its api_server module: the ``vllm`` script needs the package named vllm) in a child."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "log.txt"
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model("whisper")),
            "--served-model-name", MODEL, "--port", str(port), "--dtype", "float32", "--max-model-len", "448",
            "--kv-cache-memory-bytes", str(64 << 20), "--enforce-eager"]
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


CASES = [("transcriptions", SHORT, "en", "json"), ("transcriptions", SHORT, "de", "json"),
         ("transcriptions", OTHERS[0], "es", "json"), ("translations", SHORT, "fr", "json"),
         ("transcriptions", LONG, "en", "json"), ("transcriptions", OTHERS[1], "en", "json"),
         # no language: both detect it (the tiny model hears "id", one of the 57 languages vLLM allows)
         ("transcriptions", OTHERS[1], None, "json")]


@pytest.mark.parametrize("route, data, language, fmt", CASES)
def test_same_text_as_vllm_serve(vllm_serve, omnistage_serve, route, data, language, fmt):
    def ask(client):
        api = getattr(client.audio, route)
        out = api.create(model=MODEL, file=("clip.wav", data, "audio/wav"), response_format=fmt,
                         extra_body={"max_completion_tokens": MAX_TOKENS,
                                     **({"language": language} if language else {})})
        return out if isinstance(out, str) else out.text

    theirs, ours = ask(vllm_serve), ask(omnistage_serve)
    assert theirs.strip()  # a case with text in it
    assert ours == theirs
