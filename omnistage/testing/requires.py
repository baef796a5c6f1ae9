"""Skip here, fail in CI: what a test needs from the machine (a tool on PATH, a Python package, an FFmpeg encoder).

On a developer's machine that lacks it the test skips, saying why. In CI (the ``CI`` variable set, as CI services
set it, to anything but empty / ``0`` / ``false`` / ``no``) it fails with the same reason instead: ``make install``
installs everything these name, so a skip there would be a test that passes without having run.

Marks, checked before the test's fixtures start (this module is a pytest plugin: ``pytest_plugins`` in
tests/conftest.py loads it)::

    @requires_tool("curl", "jq")
    @requires_module("kaldi_native_fbank")
    pytestmark = requires_encoder("libmp3lame", "libopus")
    requirement(reason_or_none)          # any other check, worded by the caller

Inside a test or a fixture: ``skip_or_fail(reason)``. A skip about the hardware or the data (a GPU, a real
checkpoint) is not one of these: it stays a plain ``pytest.skip``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Mapping
from typing import NoReturn

import pytest

MARK = "requires"


def in_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """``CI`` is set to something other than empty, 0, false or no (any case)."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the running test, saying ``reason``; in CI, fail it with that reason."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set: a test that cannot run here fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


def requirement(reason: str | None) -> pytest.MarkDecorator:
    """A mark that skips (fails in CI) the test with ``reason``, or does nothing when ``reason`` is None."""
    return getattr(pytest.mark, MARK)(reason=reason)


def missing_tools(*names: str) -> list[str]:
    return [n for n in names if shutil.which(n) is None]


def missing_modules(*names: str) -> list[str]:
    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except ModuleNotFoundError:  # a dotted name whose parent package is missing
            return True

    return [n for n in names if absent(n)]


def missing_encoders(*names: str) -> list[str]:
    """Encoders absent from the FFmpeg that PyAV runs (its wheel brings its own FFmpeg build)."""
    import av

    def absent(name: str) -> bool:
        try:
            av.Codec(name, "w")  # "w": the encoder (codecs_available also lists decoder-only names)
        except ValueError:  # av's UnknownCodecError
            return True
        return False

    return sorted(n for n in names if absent(n))


def requires_tool(*names: str) -> pytest.MarkDecorator:
    missing = missing_tools(*names)
    return requirement(f"needs {' and '.join(missing)} on PATH (scripts/install-tools.sh)" if missing else None)


def requires_module(*names: str) -> pytest.MarkDecorator:
    missing = missing_modules(*names)
    return requirement(f"needs the Python module {', '.join(missing)} (pip install -e '.[dev]')" if missing else None)


def requires_encoder(*names: str) -> pytest.MarkDecorator:
    missing = missing_encoders(*names)
    why = f"PyAV's FFmpeg has no {', '.join(missing)} encoder (its wheel has them: scripts/install-tools.sh)"
    return requirement(why if missing else None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}(reason): skip with reason, or fail in CI (omnistage.testing.requires)")


def _unmet(item: pytest.Item) -> str | None:
    return next((m.kwargs["reason"] for m in item.iter_markers(MARK) if m.kwargs.get("reason")), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Off CI: pytest's own skip mark, so the skip is reported at the test (as ``skipif``'s are)."""
    if not in_ci():
        for item in items:
            if reason := _unmet(item):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """In CI: fail before any fixture of the test starts (a test that cannot run starts no server)."""
    if in_ci() and (reason := _unmet(item)):
        skip_or_fail(reason)
