"""The GPU install profile's pip dry run (`pip install -e '.[cuda,dev]'` against the index), run in the background.

It waits on the network for 40 s to 2+ min and uses ~25 s of CPU, so tests/conftest.py starts it as soon as the
test that reads it is collected, and that test (tests/test_environment.py) only reads its result: a worker is not
held waiting. One run per pytest run, however many xdist workers collect the test (the first to create the folder
starts it); the run writes ``result.json`` last, atomically.

    python -m tests.gpu_profile FOLDER    # what start() runs; FOLDER gets report.json and result.json
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/test_environment.py::test_gpu_profile_resolves"
PIP_TIMEOUT_S = 840


def folder() -> Path:
    """This pytest run's folder: xdist gives its workers one run id; a plain run is one process."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    return Path(tempfile.gettempdir()) / f"omnistage-gpu-profile-{run}"


def start() -> None:
    """Start the dry run unless this pytest run already has (mkdir is the lock between workers)."""
    out = folder()
    try:
        out.mkdir()
    except FileExistsError:
        return
    log = open(out / "runner.log", "wb")
    subprocess.Popen(
        [sys.executable, "-m", "tests.gpu_profile", str(out)],
        cwd=ROOT,
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def result(timeout_s: float = PIP_TIMEOUT_S + 60) -> dict:
    """The run's result (started here if collection did not), waiting for it if it is still running."""
    start()
    done = folder() / "result.json"
    deadline = time.monotonic() + timeout_s
    while not done.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {done} after {timeout_s:.0f} s; see {folder() / 'runner.log'}")
        time.sleep(1.0)
    return json.loads(done.read_text())


def gpu_machine_pip_env() -> dict[str, str]:
    """pip as a GPU machine with only the package index runs it: no pip config files, no find-links. This
    machine's pip config adds a local `torch-2.13.0+cpu` wheel, which would otherwise satisfy `torch==2.13.0`."""
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS" and k != "PIP_CONSTRAINT"}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def index_unreachable(env: dict[str, str]) -> str | None:
    index = env.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    ctx = ssl.create_default_context(cafile=env.get("PIP_CERT") or None)
    try:
        with urllib.request.urlopen(f"{index}/vllm/", timeout=20, context=ctx) as r:
            r.read(1)
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        return f"package index {index} unreachable ({e})"
    return None


def run(out: Path) -> dict:
    """`fast-deps` makes pip read each wheel's metadata through HTTP range requests: the index here serves no
    separate metadata files, so a plain dry run downloads every wheel (4.2 GB with the CUDA libraries; past
    600 s on a CI machine). Same resolver, same answer (checked 2026-12-03: 244 packages, equal versions)."""
    env = gpu_machine_pip_env()
    if why := index_unreachable(env):
        return {"skip": why}
    report = out / "report.json"
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--use-feature=fast-deps",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                str(report),
                f"{ROOT}[cuda,dev]",
            ],
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT_S,
            env=env,
            cwd=out,
        )
    except subprocess.TimeoutExpired:
        return {"returncode": None, "stderr": f"pip ran past {PIP_TIMEOUT_S} s"}
    return {
        "returncode": done.returncode,
        "stderr": done.stderr[-4000:],
        "install": json.loads(report.read_text())["install"] if done.returncode == 0 else [],
    }


if __name__ == "__main__":
    target = Path(sys.argv[1])
    try:
        answer = run(target)
    except Exception as e:  # the test reports it rather than waiting out its timeout
        answer = {"returncode": None, "stderr": f"{type(e).__name__}: {e}"}
    (target / "result.part").write_text(json.dumps(answer))
    (target / "result.part").rename(target / "result.json")
