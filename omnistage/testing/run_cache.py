"""Values one test run computes once for all its pytest-xdist workers.

A reference that test modules on both workers compare with (vLLM's own answers on a tiny model, say: an engine
start and a run each) is computed by the first worker that asks for it, pickled into a folder that lives as long
as the run, and read by every later asker; a second asker waits for the first instead of computing it again.
Without the folder (``OMNISTAGE_TEST_RUN_CACHE`` unset: a test run outside this project's conftest) every call
computes.

The key must name everything the value depends on; a tiny model folder's path is no part of it, as each worker
builds its own copy of the same bytes (``omnistage.testing.tiny``).
"""

from __future__ import annotations

import fcntl
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ENV = "OMNISTAGE_TEST_RUN_CACHE"
T = TypeVar("T")


def shared(key: str, compute: Callable[[], T]) -> T:
    """``compute()``'s value, computed once per test run under ``key``."""
    folder = os.environ.get(ENV)
    if not folder:
        return compute()
    path = Path(folder) / (re.sub(r"[^\w.-]", "_", key) + ".pickle")
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if path.exists():
            return pickle.loads(path.read_bytes())
        value = compute()
        tmp = path.with_suffix(".partial")
        tmp.write_bytes(pickle.dumps(value))
        tmp.replace(path)  # whole or absent: a worker killed mid-write leaves no half value
        return value


def start_run() -> str | None:
    """Make the run's folder (the process that starts the workers calls this before it does, and they inherit
    it); returns it, or None when it is set already (in a worker, or a pytest run a test starts: it shares it)."""
    if os.environ.get(ENV):
        return None
    folder = tempfile.mkdtemp(prefix="omnistage-test-run-")
    os.environ[ENV] = folder
    return folder


def end_run(folder: str | None) -> None:
    if folder:
        os.environ.pop(ENV, None)
        shutil.rmtree(folder, ignore_errors=True)
