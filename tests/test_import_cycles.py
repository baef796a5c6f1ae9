"""The omnistage package has no import cycle.

An AST walk over every module under ``omnistage/``: an edge for each import of another omnistage module,
at module level, inside functions and under ``if TYPE_CHECKING:`` alike: a deferred import still closes a
circle the day someone moves it up (it is how the registry once reached every family), and a type-only one
is a dependency a reader has to follow all the same (two modules that name each other's types are one
module). The implicit import of a module's parent packages is not an edge: a package's ``__init__`` runs
before any of its submodules whoever imports them, so counting it would make every module under
``omnistage/models/`` "import" the family list.

``from a.b import c`` is an edge to the module ``a.b.c`` when there is one, else to ``a.b``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import omnistage

ROOT = Path(omnistage.__file__).parent


def module_files() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The omnistage modules ``name`` imports (anywhere in the file, ``if TYPE_CHECKING:`` blocks included)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            visit_stmt(child)

    def visit_stmt(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if target in modules:
                    found.add(target)
                elif source in modules:
                    found.add(source)
        visit(node)

    visit(ast.parse(path.read_text(), filename=str(path)))
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_walk_sees_known_edges():
    """The walk is not vacuous: it finds module-level and function-level imports."""
    graph = import_graph()
    assert "omnistage.pipeline" in graph["omnistage.models.flux"]  # module level
    assert "omnistage.transport.process_group" in graph["omnistage.engine.stage_factory"]  # inside build_engine
    assert "omnistage.stages.diffusion.parallel.leader" in graph["omnistage.stages.diffusion.engine"]
    assert "omnistage.pipeline" in graph["omnistage.params"]  # under ``if TYPE_CHECKING:``
    assert len(graph) > 150


def test_the_detector_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_registry_imports_no_family():
    graph = import_graph()
    assert not {m for m in graph["omnistage.pipeline"] if m.startswith("omnistage.models")}
