"""scripts/suite_order.py reads a test run's time per module from pytest's JUnit XML (what make test writes) and
from a ``--durations=0`` log alike: one real pytest run of two small modules writes both, and both give the same
modules and seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import suite_order  # noqa: E402

SLOW_SETUP = """
import time
import pytest

@pytest.fixture
def slow():
    time.sleep(0.2)

def test_one(slow):
    time.sleep(0.1)

def test_two():
    time.sleep(0.3)
"""

IN_A_CLASS = """
import time

class TestThings:
    def test_it(self):
        time.sleep(0.25)
"""


def test_junit_and_durations_give_the_same_seconds_per_module(tmp_path):
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "test_a.py").write_text(SLOW_SETUP)
    (tmp_path / "tests" / "sub" / "test_b.py").write_text(IN_A_CLASS)  # a class: its name ends the classname
    xml = tmp_path / "junit.xml"
    flags = ["-p", "no:cacheprovider", "--noconftest", f"--rootdir={tmp_path}", "-c", "/dev/null"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *flags, "--durations=0", "-vv", f"--junitxml={xml}", "tests"],
        cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # plain pytest: starts in a second
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    log = tmp_path / "run.log"
    log.write_text(done.stdout)
    junit, durations = suite_order.from_junit(xml, tmp_path), suite_order.from_durations(log)
    assert set(junit) == set(durations) == {"tests/test_a.py", "tests/sub/test_b.py"}
    assert junit["tests/test_a.py"] >= 0.6 and junit["tests/sub/test_b.py"] >= 0.25  # the sleeps, setup's too
    for module in junit:
        # the log prints each phase to 10 ms: at most 5 ms off per phase, three phases per test
        assert junit[module] == pytest.approx(durations[module], abs=0.015 * 2), module
