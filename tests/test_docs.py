"""Every code block in README.md and docs/ runs, against tiny fixtures, so an example that stops working fails here.

How a block runs (by its fence's language):

- ``python``: as a script in a subprocess (``HF_HUB_OFFLINE=1``, a deadline), in a scratch folder holding the
  sample files the docs name (``cat.png``, ``in.png``, ...).
- ``bash`` / ``sh``: with ``bash -e``; ``curl`` fails on an HTTP error status (``--fail-with-body``).
- ``yaml``: parsed; a deploy config (``stages:`` / ``stage_args:``) is validated as ``--deploy-config`` is.
- ``json``: parsed.

An HTML comment on the line before a block changes that (the reader sees it in the Markdown source):

- ``<!-- docs-test: skip (why) -->``: not run; every skip is reported, with its reason, and at most ``MAX_SKIPS``
  blocks may be skipped (a skip is for what no test machine has: a GPU, a real checkpoint, a second host).
- ``<!-- docs-test: server ARGS -->``: the block runs against ``omnistage serve ARGS`` (started once per module
  for each ARGS); ``$BASE`` and ``http://localhost:8000`` point at it, ``$KEY`` is its ``--api-key``; a line of
  the block that itself starts ``omnistage serve`` is what the comment started, so it is not run again (and
  ``test_a_server_block_shows_the_server_it_runs_against`` checks that its arguments are the comment's).
- ``<!-- docs-test: serves -->``: a block of ``omnistage serve`` lines; each server is started (shared with the
  ``server`` blocks that name the same arguments) and must answer ``/health``.
- ``<!-- docs-test: setup -->``: a python block that later python blocks of the same file start with (the
  ``client = OpenAI(...)`` they share); it runs with them.

Model paths in the docs are placeholders that become tiny random-weight folders: ``PLACEHOLDERS`` below. Media
URLs on ``https://example.com/`` (the domain reserved for documentation) are served from the scratch folder.
A server is stopped after the last block that uses it (its clean exit checked when the module ends), so at most
a few run at once.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from omnistage.testing.server import ServeProcess
from omnistage.testing.tiny import build

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUNS = {"python", "bash", "sh", "yaml", "json"}
DEADLINE_S = 300  # one block; the slowest start a vLLM engine (10-20 s) on a loaded 2-core machine
MAX_SKIPS = 12  # skipped blocks allowed in all the docs
MEDIA_SITE = "https://example.com/"

# a placeholder in the docs -> the tiny fixture (``omnistage.testing.tiny`` name) that stands in for it
PLACEHOLDERS = {
    "path/to/sd3-folder": "sd3",
    "path/to/chat-model": "chat",
    "path/to/Qwen2.5-VL-3B-Instruct": "qwen2_5_vl",
    "path/to/stable-audio-open-1.0": "stable_audio",
    "path/to/LongCat-AudioDiT-1B": "longcat_audio",
    "path/to/stable-audio-3-medium": "stable_audio3",
    "path/to/ERNIE-Image": "ernie_image",
    "path/to/Cosmos3-Nano": "cosmos3",
    "path/to/Qwen3-Omni-30B-A3B-Instruct": "qwen3_omni",
    "path/to/whisper-large-v3": "whisper",
    "path/to/Wan2.1-T2V-1.3B-Diffusers": "wan",
    "path/to/Llasa-1B": "llasa voices",  # the tiny Llasa with preset voices as well: llasa_with_voices()
    "path/to/loras": "sd3 LoRAs",  # watercolor/, ink/ (folders) and pixel.safetensors for the tiny SD3: loras()
}

WORKED_FAMILY = "z_image"  # what ``<family>`` in docs/adding-a-family.md's runnable commands stands for

FENCE = re.compile(r"^```(\w*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(\w+)\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    directive: str = ""  # skip | server | setup | ""
    arg: str = ""

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, with the ``docs-test`` comment right before each (if any)."""
    out, lines, i = [], path.read_text().split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
        d = DIRECTIVE.match(lines[i - 1]) if i else None
        directive, arg = (d.group(1), d.group(2)) if d else ("", "")
        out.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1 : j]) + "\n", directive, arg))
        i = j + 1
    return out


def serve_commands(code: str) -> list[list[str]]:
    """The arguments of each ``omnistage serve`` line of a block (``\\`` continuations joined, comments dropped),
    less ``--host`` / ``--port``: the test picks a free port."""
    out = []
    for line in code.replace("\\\n", " ").split("\n"):
        if not line.lstrip().startswith("omnistage serve"):
            continue
        args, words = [], iter(shlex.split(line, comments=True)[2:])
        for w in words:
            if w in ("--host", "--port"):
                next(words, None)
            elif not w.startswith(("--host=", "--port=")):
                args.append(w)
        out.append(args)
    return out


def server_keys(b: Block) -> list[str]:
    """The servers a block runs against, as their normalised ``omnistage serve`` arguments."""
    if b.directive == "server":
        return [shlex.join(shlex.split(b.arg))]
    if b.directive == "serves":
        return [shlex.join(args) for args in serve_commands(b.code)]
    return []


ALL = [b for p in DOCS for b in blocks(p)]
RUNNABLE = [b for b in ALL if b.lang in RUNS and b.directive != "setup"]
LAST_USE = {key: b.id for b in RUNNABLE if b.directive != "skip" for key in server_keys(b)}  # later blocks win


def test_every_directive_is_known_and_every_skip_says_why():
    for b in ALL:
        known = ("", "skip", "server", "serves", "setup")
        assert b.directive in known, f"{b.id}: unknown docs-test directive {b.directive!r}"
        if b.directive == "skip":
            assert re.fullmatch(r"\(.+\)", b.arg), f"{b.id}: a skip states its reason in parentheses"
        if b.directive == "setup":
            assert b.lang == "python", f"{b.id}: only python blocks are setup"
        if b.directive == "serves":
            assert serve_commands(b.code), f"{b.id}: a serves block starts servers"
            assert not without_serve(b.code).strip(), f"{b.id}: a serves block holds only omnistage serve lines"
    untagged = [b.id for b in ALL if b.lang not in RUNS and b.lang not in ("", "text", "console", "http")]
    assert not untagged, f"blocks in a language this test does not run: {untagged}"


def test_skips_are_reported_and_stay_within_budget(capsys):
    """The tally, so that skips are never silent (``pytest -s`` shows it; so does the CI log), and the budget: a
    block that could run on a tiny fixture is made to run, not skipped."""
    skipped = [b for b in RUNNABLE if b.directive == "skip"]
    with capsys.disabled():
        print(f"\ndocs blocks: {len(RUNNABLE)} runnable, {len(RUNNABLE) - len(skipped)} run, {len(skipped)} skipped:")
        for b in skipped:
            print(f"  {b.id} {b.arg}")
    assert len(skipped) <= MAX_SKIPS, f"{len(skipped)} docs blocks skipped, at most {MAX_SKIPS} may be"


def test_a_server_block_shows_the_server_it_runs_against():
    """A ``server`` block's own ``omnistage serve`` line (less ``--host`` / ``--port``) is the command the comment
    starts: the reader's command is the one tested, not a look-alike."""
    shown = [b for b in ALL if b.directive == "server" and serve_commands(b.code)]
    assert shown, "no server block shows its omnistage serve line: the parser finds none"
    for b in shown:
        for args in serve_commands(b.code):
            assert args == shlex.split(b.arg), f"{b.id}: the block serves {shlex.join(args)!r}, the test {b.arg!r}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A scratch folder with the sample inputs the docs' examples open."""
    import numpy as np
    import soundfile as sf
    from PIL import Image

    d = tmp_path_factory.mktemp("docs-work")
    for name, colour in [("cat.png", "orange"), ("in.png", "red"), ("fox.png", "red"), ("style.png", "blue")]:
        Image.new("RGB", (64, 64), colour).save(d / name)
    Image.new("RGB", (64, 64), "gray").save(d / "first_frame.png")
    t = np.arange(16000 * 2) / 16000
    tone = 0.3 * np.sin(2 * np.pi * 220 * t)
    sf.write(d / "me.wav", tone, 16000)
    sf.write(d / "rede.wav", tone, 16000)
    sf.write(d / "talk.mp3", tone, 16000, format="MP3")
    return d


@pytest.fixture(scope="module")
def media_site(workdir) -> Iterator[str]:
    """``MEDIA_SITE`` for the blocks: the scratch folder over local HTTP (the tests have no internet)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # no line on stderr per request
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(workdir)))
    threading.Thread(target=site.serve_forever, daemon=True, name="docs-media-site").start()
    yield f"http://127.0.0.1:{site.server_port}/"
    site.shutdown()


def loras(root: Path) -> Path:
    """Random-weight diffusers LoRAs for the tiny SD3, as folders and as one bare file."""
    from omnistage.models.sd3.tiny import build_lora

    for seed, name in enumerate(["watercolor", "ink", "pixel"]):
        build_lora(root / name, seed=seed, rank=4, alpha=4.0)
    (root / "pixel" / "pytorch_lora_weights.safetensors").rename(root / "pixel.safetensors")
    return root


def llasa_with_voices(root: Path) -> Path:
    """The tiny Llasa folder (it clones voices) given two preset voices as well, as a codec_tts folder may have both:
    one speech server for the docs' preset-voice and cloning examples."""
    build("llasa", root)
    meta = json.loads((root / "omnistage.json").read_text())
    meta["prompt_template"] = meta["prompt_template"].replace("{text}", "{voice}{text}")
    meta |= {"voices": {"alto": "alto: ", "bass": "bass: "}, "default_voice": "alto"}
    (root / "omnistage.json").write_text(json.dumps(meta, indent=2) + "\n")
    return root


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, Path]:
    special = {"sd3 LoRAs": loras, "llasa voices": llasa_with_voices}

    class Lazy(dict):
        def __missing__(self, name: str) -> Path:
            where = tmp_path_factory.mktemp(f"tiny-{name.replace(' ', '-')}")
            self[name] = special[name](where) if name in special else build(name, where)
            return self[name]

    return Lazy()


def substitute(code: str, fixtures: dict[str, Path]) -> str:
    for placeholder, name in PLACEHOLDERS.items():
        if placeholder in code:
            code = code.replace(placeholder, str(fixtures[name]))
    # the guide's commands for a new family run on a family that exists, from the checkout's venv
    return code.replace("<family>", WORKED_FAMILY).replace(".venv/bin/", f"{Path(sys.executable).parent}/")


class Servers(dict):
    """``omnistage serve`` subprocesses by their (normalised) arguments, started on first use."""

    def __init__(self, logs: Callable[[], Path], fixtures: dict[str, Path]) -> None:
        super().__init__()
        self.logs, self.fixtures = logs, fixtures
        self.stopping: list[ServeProcess] = []  # sent SIGTERM; their clean exit is checked when the module ends

    def __missing__(self, key: str) -> ServeProcess:
        where = self.logs()  # also its storage: voices and video jobs the blocks make stay out of the shared default
        env = {"OMNISTAGE_SERVER_STORAGE__PATH": str(where / "storage")}
        args = shlex.split(substitute(key, self.fixtures))
        # a vLLM pipeline (Qwen3-Omni: three stages) took over 240 s to become healthy beside other test work
        self[key] = ServeProcess.launch(args, where / "server.log", ready_timeout=600, env=env)
        return self[key]

    def release(self, key: str) -> None:
        """Stop a server no later block uses: the next blocks run while it shuts down (a vLLM engine core takes
        seconds to exit); that it stopped cleanly is asserted in ``finish``."""
        if key in self:
            server = self.pop(key)
            server.terminate()
            self.stopping.append(server)

    def finish(self) -> None:
        for key in list(self):
            self.release(key)
        unclean = []
        for server in self.stopping:  # every one waited for (or killed at its deadline), then the first failure
            try:
                server.wait_stopped()
            except AssertionError as e:
                unclean.append(f"{server.log}: {e}")
        assert not unclean, unclean


@pytest.fixture(scope="module")
def servers(tmp_path_factory, fixtures) -> Iterator[Servers]:
    running = Servers(lambda: tmp_path_factory.mktemp("docs-server"), fixtures)
    yield running
    running.finish()


def api_key(args: str) -> str:
    words = shlex.split(args)
    return words[words.index("--api-key") + 1] if "--api-key" in words else ""


def without_serve(code: str) -> str:
    """The block less its ``omnistage serve ...`` command (with its ``\\`` continuation lines)."""
    kept, skipping, continued = [], False, False
    for line in code.split("\n"):
        skipping = line.lstrip().startswith("omnistage serve") or (skipping and continued)
        continued = line.rstrip().endswith("\\")
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def setup_code(block: Block) -> str:
    """The file's ``setup`` python blocks before this one."""
    return "".join(b.code for b in ALL if b.path == block.path and b.directive == "setup" and b.line < block.line)


def run(cmd: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what} ran past {DEADLINE_S} s:\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_block_runs(block: Block, workdir, fixtures, servers, media_site):
    if block.directive == "skip":
        pytest.skip(f"{block.id} {block.arg}")
    try:
        run_block(block, workdir, fixtures, servers, media_site)
    finally:  # a server no later block uses is stopped now, not at the end of the module
        for key in server_keys(block):
            if LAST_USE[key] == block.id:
                servers.release(key)


def run_block(block: Block, workdir: Path, fixtures: dict[str, Path], servers: Servers, media_site: str) -> None:
    code = substitute(setup_code(block) + block.code if block.lang == "python" else block.code, fixtures)
    code = code.replace(MEDIA_SITE, media_site)
    if block.lang == "json":
        json.loads(code)
        return
    if block.lang == "yaml":
        data = yaml.safe_load(code)
        if isinstance(data, dict) and ("stages" in data or "stage_args" in data):
            from omnistage.config.loader import load_deploy_config

            load_deploy_config(data, platform="cpu")
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # omnistage, python: the venv's
    if block.directive == "serves":
        for key in server_keys(block):
            assert httpx.get(f"{servers[key].url}/health", timeout=60).status_code == 200, f"{block.id}: {key}"
        return
    if block.directive == "server":
        server = servers[server_keys(block)[0]]
        env |= {"BASE": server.url, "KEY": api_key(block.arg)}
        code = code.replace("http://localhost:8000", server.url).replace("localhost:8000", server.url)
        code = without_serve(code)
    if block.lang == "python":
        script = workdir / f"block_{block.path.stem}_{block.line}.py"
        script.write_text(code)
        run([sys.executable, str(script)], workdir, env, block.id)
    else:
        prelude = 'curl() { command curl --silent --show-error --fail-with-body "$@"; }\n'
        run(["bash", "-e", "-o", "pipefail", "-c", prelude + code], workdir, env, block.id)


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_links_inside_the_repository_resolve(path: Path):
    """A relative link names a file or folder that exists, and its ``#anchor`` a heading of that file."""
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{path.relative_to(ROOT)}: link to {target} - no such file"
        if anchor and dest.suffix == ".md":
            slugs = {
                re.sub(r"[^\w\- ]", "", h.strip("# ").lower()).replace(" ", "-")
                for h in dest.read_text().split("\n")
                if h.startswith("#")
            }
            assert anchor in slugs, f"{path.relative_to(ROOT)}: link to {target} - no such heading"
