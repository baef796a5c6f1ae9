"""``make serve`` as the README tells a newcomer to run it: ``PORT=`` / ``HOST=`` / ``ARGS=`` reach
``omnistage serve``, the server says where to go once healthy (one line: playground, API, model name), keeps
progress bars and a misleading transformers warning out of its log, and a SIGTERM or Ctrl-C ends it without
make's "*** Terminated" line; ``--help`` states the defaults."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from omnistage.cli.uvicorn_server import ready_line
from omnistage.testing.server import HOST, free_port

REPO = Path(__file__).resolve().parents[2]
STAMP = ".venv/.installed"  # make -o: the install step counts as done (this test runs inside that venv)


def make(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "-o", STAMP, *args], cwd=REPO, capture_output=True, text=True, timeout=60, **kw
    )


def test_make_passes_port_host_and_args():
    out = make("-n", "serve", "PORT=9999").stdout
    assert "omnistage serve" in out and "--port 9999" in out and "--host 0.0.0.0" in out
    out = make(
        "-n", "serve", "PORT=8123", "HOST=127.0.0.1", "ARGS=--api-key secret --max-pending 4", "MODEL=/models/x"
    ).stdout
    assert "omnistage serve /models/x --host 127.0.0.1 --port 8123 --api-key secret --max-pending 4" in out
    assert out.lstrip().startswith("exec ")  # the server replaces the shell: signals reach it, not a wrapper


def _serve(log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        ["make", "-o", STAMP, "serve", f"PORT={port}", f"HOST={HOST}"],
        cwd=REPO,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 240
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"make serve did not become healthy:\n{log.read_text()[-3000:]}")
        time.sleep(0.25)


@pytest.mark.slow
@pytest.mark.parametrize("sig, to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)], ids=["sigterm", "ctrl-c"])
def test_make_serve_says_where_and_stops_quietly(tmp_path, sig, to_group):
    log = tmp_path / "serve.log"
    proc, url = _serve(log)
    try:
        port = int(url.rsplit(":", 1)[1])
        deadline = time.monotonic() + 10  # logged right after the socket listens: /health may answer first
        while ready_line(HOST, port, "omnistage-demo") not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = log.read_text()
        line = ready_line(HOST, port, "omnistage-demo")
        assert line in text and f"playground: {url}/" in line and f"API: {url}/v1" in line, text[-2000:]
        assert "Loading pipeline components" not in text and "it/s]" not in text, text  # no progress bars
        card = httpx.get(f"{url}/v1/models").json()["data"][0]
        assert card["id"] == "omnistage-demo"
        if sig == signal.SIGTERM:  # a prompt past the demo's 16 tokens: diffusers says what it cut, no more
            long = "a large red circle on the left on a black background " * 3
            r = httpx.post(f"{url}/v1/images/generations", json={"prompt": long, "num_inference_steps": 1}, timeout=120)
            assert r.status_code == 200, r.text
            text = log.read_text()
            assert "truncated because CLIP can only handle sequences up to 16 tokens" in text, text[-2000:]
            assert "Token indices sequence length" not in text
    finally:
        # SIGTERM to make (a process manager), or SIGINT to the whole foreground group (Ctrl-C in a terminal)
        (os.killpg if to_group else os.kill)(proc.pid, sig)
        code = proc.wait(90)
    text = log.read_text()
    # make itself, signalled, still ends by the signal; the server below it exits 0, so make adds no error line
    assert code in (0, -sig), text[-2000:]
    assert "***" not in text and "Terminated" not in text and "Interrupt" not in text, text[-2000:]
    assert "omnistage.server: shutdown complete" in text


def test_help_says_the_defaults(capsys):
    from omnistage.cli.main import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "generate images, speech or video" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 0.0.0.0, every interface)" in text and "(default: 8000)" in text
    assert "default: omnistage-demo for the built-in demo, else the model folder's name" in text
