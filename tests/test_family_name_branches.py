"""Nothing outside a family's folder branches on a family's name: the benchmarks, the server, the CLI and the
engine choose by what a pipeline declares (``Pipeline.info``, its stages), never by ``family == "wan"``.

An AST walk over ``benchmarks/*.py`` and every file of ``omnistage/`` outside ``omnistage/models/<family>/``
(``models/shared/`` included) finds each comparison (``==``, ``!=``, ``in``, ``not in``, a ``match`` case)
against a string naming a registered family, pipeline or tiny fixture, and each lookup in an inline dict
literal keyed by such names (``{"qwen3_tts": 1920}.get(family)``, a name table in disguise). A module-level
table of which fixtures a benchmark runs, and at what sizes, is data and stays allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import omnistage.models
from omnistage.pipeline import registered_pipelines, tiny_builders

REPO = Path(__file__).resolve().parents[1]
MODELS = Path(omnistage.models.__file__).parent
FAMILIES = {p.name for p in MODELS.iterdir() if (p / "__init__.py").is_file() and p.name != "shared"}
# also a word of the API itself: the /v1/chat/completions request kind, compared as such by omnistage/bench
API_WORDS = {"chat"}


def family_names() -> set[str]:
    return (FAMILIES | set(registered_pipelines()) | set(tiny_builders())) - API_WORDS


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _dict_lookup(node: ast.AST) -> ast.Dict | None:
    """The inline dict literal that ``node`` looks a key up in (``{...}[k]``, ``{...}.get(k)``), if any."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
        return node.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and isinstance(node.func.value, ast.Dict)
    ):
        return node.func.value
    return None


def name_branches(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each comparison against, or inline-dict lookup keyed by, one of ``names``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare) and all(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            strings = [s for side in (node.left, *node.comparators) for s in _strings(side)]
        elif isinstance(node, ast.MatchValue):
            strings = _strings(node.value)
        elif (table := _dict_lookup(node)) is not None:
            strings = [s for k in table.keys if k is not None for s in _strings(k)]
        else:
            continue
        found += [(node.lineno, s) for s in strings if s in names]
    return found


def checked_files() -> list[Path]:
    files = sorted((REPO / "benchmarks").glob("*.py"))
    for path in sorted((REPO / "omnistage").rglob("*.py")):
        parts = path.relative_to(MODELS.parent).parts
        if parts[0] == "models" and len(parts) > 2 and parts[1] != "shared":
            continue  # a family's own folder may name itself
        files.append(path)
    return files


def test_the_walk_sees_every_kind_of_branch(tmp_path):
    """Not vacuous: each form is found, an API word and a data table are not, and the scope is what it says."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "SIZES = {'flux': 64, 'sana': 128}\n"  # a data table: allowed
        "if family == 'wan': pass\n"
        "if 'sd3' != name: pass\n"
        "if args.family in ('qwen3_tts', 'higgs_audio'): pass\n"
        "match family:\n"
        "    case 'csm': pass\n"
        "hop = {'qwen3_tts': 1920}.get(family, 320)\n"
        "rate = {'voxcpm': 48000}[family]\n"
        "if kind == 'chat': pass\n"
        "if mode == 'streamed': pass\n"
    )
    found = name_branches(probe, family_names())
    assert sorted(found) == [
        (2, "wan"),
        (3, "sd3"),
        (4, "higgs_audio"),
        (4, "qwen3_tts"),
        (6, "csm"),
        (7, "qwen3_tts"),
        (8, "voxcpm"),
    ]
    files = {p.relative_to(REPO).as_posix() for p in checked_files()}
    assert "benchmarks/tts_load.py" in files and "omnistage/server/app.py" in files
    assert "omnistage/models/shared/speech_family.py" in files and "omnistage/models/wan/__init__.py" not in files
    assert {"wan", "sd3", "llasa", "qwen3_tts"} <= family_names()


def test_nothing_outside_a_family_branches_on_its_name():
    names = family_names()
    found = [
        f"{path.relative_to(REPO)}:{line} compares against {name!r}"
        for path in checked_files()
        for line, name in name_branches(path, names)
    ]
    assert not found, (
        "choose by what the pipeline declares (Pipeline.info, its stages; add a typed field to omnistage/info.py "
        "where none says it):\n" + "\n".join(found)
    )
