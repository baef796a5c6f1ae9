"""pytest fixtures: tiny model folders built once per session and cached.

Use from a conftest: ``pytest_plugins = ["omnistage.testing.fixtures"]``;
then ``tiny_model("sd3")`` returns the folder path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from omnistage.testing.tiny import build


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = build(family, tmp_path_factory.mktemp(f"tiny-{family}"))
        return cache[family]

    return get
