"""Every figure of jaxroll lives in `jaxroll.plot` and none uses pyplot (issue 42).

The oracle is the source, read with `ast` (as tests/test_layout.py reads it):
every ``import`` and ``from ... import`` at any depth of every module, so an
import inside a function counts as much as one at the top. pyplot keeps a
global figure manager and picks a backend; the package draws on a
`matplotlib.figure.Figure` with an Agg canvas instead, so a figure never
needs a display and is freed when it is dropped.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "jaxroll"
PLOT = PACKAGE / "plot"


def imported_modules(source: str) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in `source` names, at any nesting level.

    ``from matplotlib import pyplot`` names ``matplotlib.pyplot`` as well as
    ``matplotlib``: the imported name may be the submodule.
    """
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def uses_pyplot(source: str) -> bool:
    return any(name == "matplotlib.pyplot" or name.startswith("matplotlib.pyplot.")
               for name in imported_modules(source))


def uses_matplotlib(source: str) -> bool:
    return any(name.split(".")[0] == "matplotlib" for name in imported_modules(source))


@pytest.mark.parametrize("source", [
    "import matplotlib.pyplot",
    "import matplotlib.pyplot as plt",
    "from matplotlib import pyplot",
    "from matplotlib import pyplot as plt",
    "from matplotlib.pyplot import subplots",
    "def draw():\n    import matplotlib\n    matplotlib.use('Agg')\n    import matplotlib.pyplot as plt\n",
    "class Figures:\n    def draw(self):\n        if True:\n            from matplotlib import colors, pyplot\n",
])
def test_the_checker_finds_pyplot_at_any_depth(source):
    assert uses_pyplot(source)


@pytest.mark.parametrize("source", [
    "import matplotlib",
    "from matplotlib.figure import Figure",
    "from matplotlib.backends.backend_agg import FigureCanvasAgg",
    "from . import pyplot",  # a module of the package's own, not matplotlib's
    "pyplot = 1",
])
def test_the_checker_passes_what_is_not_pyplot(source):
    assert not uses_pyplot(source)


def _modules() -> list[Path]:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 50 and PLOT / "__init__.py" in modules  # the walk reads the real package
    return modules


def test_no_module_of_the_package_imports_pyplot():
    offenders = [str(path.relative_to(PACKAGE.parent)) for path in _modules() if uses_pyplot(path.read_text())]
    assert offenders == []


def test_only_the_plot_package_imports_matplotlib():
    """One home for figures: a module outside jaxroll/plot/ that draws would import matplotlib."""
    offenders = [str(path.relative_to(PACKAGE.parent)) for path in _modules()
                 if PLOT not in path.parents and uses_matplotlib(path.read_text())]
    assert offenders == []
