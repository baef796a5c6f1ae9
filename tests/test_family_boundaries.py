"""No family imports another family; what several families use lives in ``omnistage/models/shared/``.

A family is a folder under ``omnistage/models/`` (other than ``shared``). An AST walk over each of its files
finds every import of ``omnistage.models.<name>`` — at module level, inside functions and under
``if TYPE_CHECKING:`` alike — and every string naming one (a ``lazy("module:factory")`` target, a vLLM plugin
entry), and refuses any that names another family. ``shared`` names no family at all. The registry
(``omnistage/models/__init__.py``) is the one module that imports them all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import omnistage.models

MODELS = Path(omnistage.models.__file__).parent
SHARED = "shared"
FAMILIES = sorted(p.name for p in MODELS.iterdir() if (p / "__init__.py").is_file() and p.name != SHARED)


def named_models(path: Path) -> set[tuple[int, str]]:
    """(line, name) of each folder under omnistage/models that ``path`` imports or names in a string."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            modules = [node.module or ""]
            if node.module == "omnistage.models":  # ``from omnistage.models import whisper``
                modules = [f"omnistage.models.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            modules = [node.value.split(":")[0]] if node.value.startswith("omnistage.models.") else []
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[:2] == ["omnistage", "models"] and len(parts) > 2:
                found.add((node.lineno, parts[2]))
    return found


def crossings() -> list[str]:
    out = []
    for folder in [*FAMILIES, SHARED]:
        for path in sorted((MODELS / folder).rglob("*.py")):
            for line, name in sorted(named_models(path)):
                if name != folder and name != SHARED and name in FAMILIES:
                    out.append(f"{path.relative_to(MODELS.parent.parent)}:{line} uses family {name!r}")
    return out


def test_the_walk_sees_every_kind_of_reference(tmp_path):
    """Not vacuous: module-level, function-level, type-only and string references are all found."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from omnistage.models.flux.adapter import FluxAdapter\n"
        "from omnistage.models import wan\n"
        "if TYPE_CHECKING:\n"
        "    from omnistage.models.sd3 import PIPELINE\n"
        "def f():\n"
        "    import omnistage.models.whisper.tiny\n"
        "X = 'omnistage.models.csm.engine:build_backbone_engine'\n"
    )
    assert {name for _, name in named_models(source)} == {"flux", "wan", "sd3", "whisper", "csm"}
    assert len(FAMILIES) > 20 and "shared" not in FAMILIES


def test_no_family_uses_another_family():
    found = crossings()
    assert not found, "move what several families use to omnistage/models/shared/:\n" + "\n".join(found)
