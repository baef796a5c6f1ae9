"""Layers point one way: server → engine → stages, the transport handed in, families plugging into stages.

Nothing below imports what is above it: the registry of families and the stage factory are passed down
(``omnistage/__init__.py`` fills the registry; ``engine/stage_factory.py`` picks the transport). The walk is
``tests/test_import_cycles.py``'s (module-level, function-level and type-only imports alike), plus every
string that names an omnistage module (an ``import_module`` or ``lazy("module:factory")`` target), so a
deferred import cannot hide an edge.
"""

from __future__ import annotations

import ast

from tests.test_import_cycles import ROOT, import_graph, module_files

# (layer, the layers it must not reach): each a package under omnistage/
FORBIDDEN = {
    "models": ("server", "engine", "cli", "transport"),
    "stages": ("server", "engine", "cli", "transport", "models"),
    "engine": ("server", "cli", "models"),
    "transport": ("server", "engine", "cli", "models"),
    "media": ("server", "engine", "cli", "stages", "transport", "models"),
    "config": ("server", "engine", "cli", "stages", "transport", "models"),
}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def named_modules(path, modules: set[str]) -> set[str]:
    """Omnistage modules named by a string constant (``"omnistage.x.y"`` or ``"omnistage.x.y:factory"``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("omnistage."):
            name = node.value.split(":")[0]
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def upward_edges(graph: dict[str, set[str]], named: dict[str, set[str]]) -> list[str]:
    out = []
    for source in sorted(graph):
        banned = FORBIDDEN.get(layer(source) or "", ())
        for target in sorted(graph[source] | named.get(source, set())):
            if layer(target) in banned:
                out.append(f"{source} -> {target}")
    return out


def test_the_check_sees_an_upward_edge():
    """Not vacuous: an import edge and a string naming a module above are both reported."""
    graph = {"omnistage.stages.x": {"omnistage.transport.process"}, "omnistage.engine.y": set()}
    named = {"omnistage.engine.y": {"omnistage.models"}}
    assert upward_edges(graph, named) == [
        "omnistage.engine.y -> omnistage.models",
        "omnistage.stages.x -> omnistage.transport.process",
    ]
    files = module_files()
    probe = {m for m in named_modules(ROOT / "engine" / "stage_factory.py", set(files))}
    assert probe == set()  # the factory imports its transports, it does not name them in strings
    assert len(files) > 150


def test_layers_point_one_way():
    files = module_files()
    modules = set(files)
    named = {m: named_modules(p, modules) for m, p in files.items()}
    found = upward_edges(import_graph(), named)
    assert not found, "imports that run back up the layers (pass the thing down instead):\n" + "\n".join(found)
