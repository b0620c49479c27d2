"""The package's layout (docs/design.md, "Layout"): imports go one way, modules stay small.

The oracle is the source itself, read with `ast`: every ``import`` and
``from ... import`` between jaxroll's own modules, at module level or inside
a function, is an edge; the graph must have no cycle. A registry lives below
the modules that register in it.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jaxroll"
MAX_LINES = 620  # docs/design.md, "Layout": "under about 600 lines"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """Edges module -> the jaxroll modules it imports (a package import counts as its __init__)."""
    modules = _modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                # `from . import x` names a submodule when x is one, else an attribute of the package.
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("jaxroll"):
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    # Tarjan's strongly connected components; a component of two or more modules is a cycle.
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:k]) for k in range(1, len(parts))}


def test_no_two_modules_import_each_other():
    graph = import_graph()
    # A submodule's import of its own package (or a package's __init__ re-exporting its
    # submodules) is the package's public surface, not a dependency between ideas.
    graph = {name: {other for other in targets if other not in _parents(name) and name not in _parents(other)}
             for name, targets in graph.items()}
    assert _cycles(graph) == []


def test_the_measure_registry_sits_below_the_statistics():
    graph = import_graph()
    registry = graph["jaxroll.measure.registry"]
    assert not registry & {"jaxroll.measure.passes", "jaxroll.measure.sinks", "jaxroll.measure.refinements"}
    for statistic_module in ("jaxroll.measure.sinks", "jaxroll.measure.refinements"):
        assert "jaxroll.measure.registry" in graph[statistic_module]
        assert "jaxroll.measure.passes" not in graph[statistic_module]


def test_no_module_is_over_about_600_lines():
    lengths = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
    assert max(lengths.values()) > 100  # the check reads real files
