"""A test that needs a missing tool skips on a developer's machine and fails in CI (omnistage/testing/requires.py),
checked on a real one: the compat curl | jq client test, run by pytest in a subprocess whose PATH has neither."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnistage.testing.requires import in_ci

ROOT = Path(__file__).resolve().parents[1]
CURL_TEST = "tests/compat/test_vllm_omni_diffusion_clients.py::test_text_to_image_curl_script"


def run_without_curl_and_jq(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    empty = tmp_path / "bin"
    empty.mkdir(parents=True)
    # this run's own pytest settings (xdist's worker ids, addopts) stay out of the inner run
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("PYTEST_")}
    env["PATH"] = str(empty)  # python is started by its full path: nothing else is needed on PATH
    if ci is not None:
        env["CI"] = ci
    cmd = [sys.executable, "-m", "pytest", "-q", "-rsE", "-p", "no:cacheprovider", "-p", "no:xdist", CURL_TEST]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_missing_tool_fails_the_test_in_ci_and_skips_it_elsewhere(tmp_path):
    failed = run_without_curl_and_jq(tmp_path / "ci", "true")
    out = failed.stdout + failed.stderr
    assert failed.returncode == 1, out  # 1: tests ran and some failed (not 4/5: a usage or collection error)
    assert "needs curl and jq on PATH" in out and "CI is set" in out, out
    assert "1 error" in out and "skipped" not in out, out  # failed at setup: the t2i server never started

    skipped = run_without_curl_and_jq(tmp_path / "dev", None)
    out = skipped.stdout + skipped.stderr
    assert skipped.returncode == 0, out
    assert "1 skipped" in out and "needs curl and jq on PATH" in out, out


@pytest.mark.parametrize(
    "value, ci", [("", False), ("0", False), ("false", False), ("No", False), ("true", True), ("1", True)]
)
def test_ci_is_any_value_but_empty_0_false_no(value, ci):
    assert in_ci({"CI": value}) is ci
    assert in_ci({}) is False
