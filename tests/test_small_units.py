"""Small units: no function in ``omnistage/`` runs over 100 lines (a reader holds one on a screen or two).

An AST walk over every module, nested functions and methods included; a function's length runs from its first
decorator (or ``def``) to its last line, docstring counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import omnistage

ROOT = Path(omnistage.__file__).parent
MAX_LINES = 100


def long_functions(path: Path) -> list[tuple[str, int]]:
    """(name, lines) of each function in ``path`` longer than ``MAX_LINES``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
            if lines > MAX_LINES:
                out.append((node.name, lines))
    return out


def test_the_walk_measures_methods_and_nested_functions(tmp_path):
    """Not vacuous: a long method and a long nested function (and the function holding it) are found; a function
    of exactly the limit is not."""
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    probe = tmp_path / "probe.py"
    probe.write_text(f"class A:\n    def long(self):\n{body}\n\ndef outer():\n    def inner():\n{body}\n\n")
    probe.write_text(probe.read_text() + "def fits():\n" + "\n".join(f"    y{i} = {i}" for i in range(MAX_LINES - 1)))
    assert {name for name, _ in long_functions(probe)} == {"long", "inner", "outer"}


def test_no_function_over_100_lines():
    found = [
        f"{path.relative_to(ROOT.parent)}: {name} ({lines} lines)"
        for path in sorted(ROOT.rglob("*.py"))
        for name, lines in long_functions(path)
    ]
    assert not found, "split these into named steps:\n" + "\n".join(found)


def test_the_readme_stays_a_page():
    """README.md: what omnistage is, the two set-up commands, the families table; detail lives under docs/."""
    lines = (ROOT.parent / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail to docs/"
