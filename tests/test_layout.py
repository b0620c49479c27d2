"""The package's layout (docs/design.md, "Layout"): imports go one way, modules stay small.

The oracle is the source itself, read with `ast`: every ``import`` and
``from ... import`` between jaxroll's own modules, at module level or inside
a function, is an edge; the graph must have no cycle, between modules and
between folders, and no edge climbs the floors of docs/design.md's "Data
flows one way". A registry lives below the modules that register in it. No
module takes an underscore name from another folder, and callers ask a kernel
or an intervention what it can do instead of testing its type.
"""

import ast
import re
import collections
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


# ---- folders -------------------------------------------------------------------------------

FACE = {"jaxroll", "jaxroll.__main__"}  # the package face re-exports; its own imports are not arrows

# docs/design.md, "Data flows one way", lowest floor first. A folder (or a top-level
# module) imports from its own floor or the floors below, never from a floor above;
# on one floor an import goes one way only (the cycle test). The face sits above
# everything: no module of the package imports it.
FLOORS = [
    ("errors", "version", "cache", "progress", "_lazy", "optimisers", "_checks", "_readers", "memory"),  # helpers
    ("schedules", "engine"),              # schedules and kernels
    ("kernel_types", "model"),            # the model type (and the kernels' registry)
    ("rollout", "presets", "bucket"),     # the rollout, and models built or batched for it
    ("metrics", "theory"),
    ("interventions",),
    ("fitting", "sweeps", "designs"),     # fit and sweep (and design, which fits)
    ("io", "schema", "plot", "published", "numpy_rollout"),  # numpy_rollout: small rollouts of io's files, no JAX
    ("measure",),                         # the torch side: measure -> task
    ("task",),
    ("cli",),
]


def _folder(module: str) -> str:
    """jaxroll.measure.passes -> jaxroll.measure; jaxroll.model stays itself; the face stays itself."""
    return module if module in FACE else ".".join(module.split(".")[:2])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Collapse each module to its folder; the face's own imports (re-exports) are left out."""
    folders = {_folder(name): set() for name in graph}
    for name, targets in graph.items():
        if name in FACE:
            continue
        folders[_folder(name)] |= {_folder(t) for t in targets} - {_folder(name)}
    return folders


def _arrows_up(graph: dict[str, set[str]], floors: list[tuple[str, ...]]) -> list[tuple[str, str]]:
    floor = {f"jaxroll.{name}": k for k, names in enumerate(floors) for name in names}
    floor.update({name: len(floors) for name in FACE})
    unplaced = sorted(set(graph) - set(floor))
    assert unplaced == [], f"place these in FLOORS: {unplaced}"
    return sorted((a, b) for a, targets in graph.items() for b in targets if floor[b] > floor[a])


def test_the_folder_graph_collapses_modules_to_their_folder():
    graph = {"jaxroll.measure.passes": {"jaxroll.measure.hooks", "jaxroll.rollout"},
             "jaxroll.measure.hooks": set(), "jaxroll.rollout": {"jaxroll.engine.plan"},
             "jaxroll.engine.plan": set(), "jaxroll": {"jaxroll.measure.passes"}}
    assert folder_graph(graph) == {"jaxroll.measure": {"jaxroll.rollout"}, "jaxroll.rollout": {"jaxroll.engine"},
                                   "jaxroll.engine": set(), "jaxroll": set()}


def test_the_checkers_find_a_planted_folder_cycle_and_a_planted_arrow_up():
    # interventions/a -> measure/b and measure/c -> interventions/d: no file cycle, a folder cycle.
    graph = {"jaxroll.interventions.a": {"jaxroll.measure.b"}, "jaxroll.measure.b": set(),
             "jaxroll.measure.c": {"jaxroll.interventions.d"}, "jaxroll.interventions.d": set()}
    assert _cycles(graph) == []
    assert _cycles(folder_graph(graph)) == [["jaxroll.interventions", "jaxroll.measure"]]
    assert _arrows_up(folder_graph(graph), FLOORS) == [("jaxroll.interventions", "jaxroll.measure")]
    # theory -> fitting climbs; fitting -> theory does not; a module importing the face climbs.
    assert _arrows_up({"jaxroll.theory": {"jaxroll.fitting"}, "jaxroll.fitting": set()}, FLOORS) == [
        ("jaxroll.theory", "jaxroll.fitting")]
    assert _arrows_up({"jaxroll.fitting": {"jaxroll.theory"}, "jaxroll.theory": set()}, FLOORS) == []
    assert _arrows_up({"jaxroll.cli": {"jaxroll"}, "jaxroll": set()}, FLOORS) == [("jaxroll.cli", "jaxroll")]


def test_no_two_folders_import_each_other():
    assert _cycles(folder_graph(import_graph())) == []


def test_no_import_climbs_a_floor():
    assert _arrows_up(folder_graph(import_graph()), FLOORS) == []


def test_the_floors_are_the_order_of_the_design_page():
    # The chain docs/design.md draws, in the floors' order.
    text = " ".join((PACKAGE.parent / "docs" / "design.md").read_text().split())
    chain = text.partition("Data flows one way:")[2].partition(".")[0]
    floor = {name: k for k, names in enumerate(FLOORS) for name in names}
    named = [("schedules", "schedules"), ("engine/", "engine"), ("model", "model"), ("rollout", "rollout"),
             ("metrics", "metrics"), ("theory", "theory"), ("interventions", "interventions"), ("fit", "fitting"),
             ("sweep", "sweeps"), ("design", "designs"), ("io", "io"), ("schema", "schema"), ("plot", "plot"),
             ("published", "published"), ("cli", "cli")]
    positions = [re.search(rf"(?<![\w/]){re.escape(word)}(?!\w)", chain).start() for word, _ in named]
    assert positions == sorted(positions)
    assert [floor[folder] for _, folder in named] == sorted(floor[folder] for _, folder in named)
    torch_side = text.partition("and measure ->")[2].split()[0]
    assert torch_side == "task" and floor["measure"] < floor["task"]


# ---- underscore names ------------------------------------------------------------------------

def underscore_imports(sources: dict[str, tuple[str, bool]], modules: set[str]) -> dict[str, list[str]]:
    """`module <- source` -> the underscore names it takes from another folder.

    `sources` maps a module name to (its source, whether it is a package's __init__).
    A submodule imported by its own name (``from .. import _checks``) is a module,
    not a private name; dunder names are Python's.
    """
    found = collections.defaultdict(list)
    for name, (source, is_package) in sources.items():
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _resolve(name, is_package, node)
            if not base.startswith("jaxroll") or _folder(base) == _folder(name):
                continue
            found[f"{name} <- {base}"] += [
                alias.name for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
                and f"{base}.{alias.name}" not in modules]
    return {edge: names for edge, names in found.items() if names}


def test_the_underscore_finder_finds_a_planted_private_import():
    sources = {"jaxroll.designs.optimise": ("from ..fitting.problem import _setup, public\n"
                                             "from .objective import _Problem\n"
                                             "from .. import _checks\n"
                                             "from .._checks import check_positive\n", False),
               "jaxroll.fitting.problem": ("def f():\n    from ..rollout import _influence_with_mass\n", False)}
    modules = {"jaxroll.designs.optimise", "jaxroll.fitting.problem", "jaxroll._checks",
               "jaxroll.designs.objective", "jaxroll.rollout"}
    assert underscore_imports(sources, modules) == {
        "jaxroll.designs.optimise <- jaxroll.fitting.problem": ["_setup"],
        "jaxroll.fitting.problem <- jaxroll.rollout": ["_influence_with_mass"]}


def test_no_module_imports_an_underscore_name_from_another_folder():
    modules = _modules()
    sources = {name: (path.read_text(), path.name == "__init__.py") for name, path in modules.items()}
    assert underscore_imports(sources, set(modules)) == {}


# ---- type tests on kernels and interventions -------------------------------------------------

MAX_TYPE_TESTS = 6  # issue 52: a kernel or an intervention says what it can do; callers ask it


def _subclasses(trees: list[ast.Module], roots: set[str]) -> set[str]:
    """Class names deriving (at any depth, within these sources) from one of `roots`."""
    bases = collections.defaultdict(set)
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases[node.name] |= {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
                                     for base in node.bases}
    found = set(roots)
    while more := {name for name, parents in bases.items() if parents & found} - found:
        found |= more
    return found


def _named(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*map(_named, node.elts))
    if isinstance(node, ast.BinOp):  # isinstance(x, A | B)
        return _named(node.left) | _named(node.right)
    return set()


def type_tests(trees: list[ast.Module]) -> int:
    """How many ``isinstance(x, T)`` calls name a kernel or an intervention type as T.

    The abstract bases themselves do not count: ``isinstance(x, AbstractKernel)``
    asks whether x is a kernel at all, not which one.
    """
    roots = {"AbstractKernel", "AbstractIntervention"}
    types = _subclasses(trees, roots) - roots
    return sum(1 for tree in trees for node in ast.walk(tree)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
               and len(node.args) == 2 and _named(node.args[1]) & types)


def test_the_type_test_counter_counts_planted_type_tests():
    trees = [ast.parse("class AbstractKernel: ...\nclass AlibiKernel(AbstractKernel): ...\n"
                       "class Sinks(AlibiKernel): ...\nclass AbstractIntervention: ...\n"
                       "class Temperature(engine.AbstractIntervention): ...\n"),
             ast.parse("isinstance(k, AlibiKernel)\nisinstance(k, (int, kinds.Sinks))\n"
                       "isinstance(i, Temperature | None)\nisinstance(k, int)\nisinstance(k, AbstractKernel)\n")]
    assert type_tests(trees) == 3


def test_at_most_six_type_tests_on_kernels_and_interventions():
    trees = [ast.parse(path.read_text()) for path in _modules().values()]
    assert type_tests(trees) <= MAX_TYPE_TESTS
