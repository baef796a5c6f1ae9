"""omnistage/testing/run_cache.py: a value is computed once per test run, and another process of the run (an xdist
worker) reads it instead of computing it; a compute that fails leaves nothing behind; outside a run every call
computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnistage.testing import run_cache
from omnistage.testing.run_cache import ENV, shared

# the module on its own (runpy): the other process need not import omnistage and torch
OTHER_WORKER = "import runpy, sys; shared = runpy.run_path(sys.argv[1])['shared']; print(shared('k', lambda: 1 / 0))"


def test_computed_once_and_read_by_another_process(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    calls = []
    assert shared("k", lambda: calls.append(1) or {"a": [1, 2]}) == {"a": [1, 2]}
    assert shared("k", lambda: calls.append(1) or "again") == {"a": [1, 2]}
    out = subprocess.run(
        [sys.executable, "-c", OTHER_WORKER, str(Path(run_cache.__file__))],
        env={**os.environ, ENV: str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'a': [1, 2]}" and calls == [1]


def test_a_failed_compute_leaves_nothing_and_no_run_computes_each_time(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    with pytest.raises(ZeroDivisionError):
        shared("k", lambda: 1 / 0)
    assert shared("k", lambda: 2) == 2
    monkeypatch.delenv(ENV)
    assert [shared("k", lambda: 3), shared("k", lambda: 4)] == [3, 4]


def test_a_run_folder_is_made_once_and_removed(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    folder = run_cache.start_run()
    assert folder and os.environ[ENV] == folder and Path(folder).is_dir()
    assert run_cache.start_run() is None  # a worker (or a pytest run inside a test) shares the run's folder
    run_cache.end_run(folder)
    assert ENV not in os.environ and not Path(folder).exists()


# the tiny families whose references the test run shares (run_cache.shared keys name the family, not the folder)
SHARED_FROM = ["chat", "chat_lora", "vlm", "audio_lm", "qwen2_5_vl", "qwen3_vl", "qwen3_omni", "qwen2_5_omni"]
BUILD = "import sys; from omnistage.testing.tiny import build; [build(f, sys.argv[1] + '/' + f) for f in sys.argv[2:]]"


@pytest.mark.slow
def test_each_worker_builds_the_same_bytes_for_a_shared_reference(tiny_model, tmp_path):
    """What lets one worker's reference stand for the other's: another process (another hash seed) builds
    every file of these tiny folders byte for byte as this one did."""
    env = {**os.environ, "PYTHONHASHSEED": "12345", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(tmp_path), *SHARED_FROM], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for family in SHARED_FROM:
        mine, theirs = tiny_model(family), tmp_path / family
        files = sorted(str(p.relative_to(mine)) for p in mine.rglob("*") if p.is_file())
        assert files == sorted(str(p.relative_to(theirs)) for p in theirs.rglob("*") if p.is_file()), family
        for name in files:
            assert same_file(mine / name, theirs / name), f"{family}: {name}"


def same_file(a: Path, b: Path) -> bool:
    if a.name == "adapter_config.json":  # peft writes target_modules from a set: in the order of the hash seed
        x, y = (json.loads(f.read_text()) for f in (a, b))
        return {**x, "target_modules": sorted(x["target_modules"])} == {
            **y,
            "target_modules": sorted(y["target_modules"]),
        }
    return a.read_bytes() == b.read_bytes()
