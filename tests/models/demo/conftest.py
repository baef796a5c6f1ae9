"""Shared fixtures for the demo family's tests: the demo's rendering code (demo/ is a script folder)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def shapes():
    """demo/shapes.py (a script folder, not a package)."""
    spec = importlib.util.spec_from_file_location("demo_shapes", REPO / "demo" / "shapes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
