"""The walk-through notebooks under notebooks/ are paired and run from top to bottom.

Each notebook's source is a jupytext percent-format file ``notebooks/NN_name.py``
(what a review reads); the committed ``notebooks/NN_name.ipynb`` is made from
it and carries its outputs, so the docs site renders them without executing
anything. Regenerate one after editing its source with

    jupytext --to ipynb --execute notebooks/NN_name.py

Every notebook is executed here in a fresh ``python3`` kernel (nbclient), as
a reader would run it: this test, not the docs build, is what executes them.
A notebook ends by asserting the paper claim it shows against a property
computed in plain NumPy inside the notebook (attention-only p[0] > 0.99 and
an interior minimum with both ends above it; the forces' signs and CDF
dominance for the content sign; the depth dichotomy against the product
bound; fits lowering W1 while per-layer lambdas stay unidentifiable; a
measured profile closer to the rollout than to the attention-only rollout),
so "ran without error" means those claims held. The test sets
``JAXROLL_NOTEBOOK_SMOKE=1`` (the kernel inherits the environment): where a
size costs run time rather than compilation (05's sequences, 06's Adam
steps), the notebook then runs smaller, with every cell and every check
unchanged; the committed outputs are the full sizes'.
"""

from pathlib import Path

import jupytext
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Notebooks that need the `measure` extra (torch, transformers); skipped without it.
NEEDS_TORCH = {"05_measure", "07_interventions", "08_design"}
# Generous per-cell limit: the slowest cell (04's fits) takes ~10 s on an idle
# 2-core machine; this only stops a hung kernel.
CELL_TIMEOUT = 600


def _cells(notebook):
    """What pairing must preserve: each cell's kind, source and tags."""
    return [(cell.cell_type, cell.source.strip(), tuple(cell.metadata.get("tags", [])))
            for cell in notebook.cells]


def test_every_source_has_its_notebook_and_the_same_cells():
    assert len(SOURCES) >= 5, SOURCES
    assert [path.stem for path in NOTEBOOKS] == [path.stem for path in SOURCES], "unpaired notebook or source"
    for source in SOURCES:
        notebook = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
        nbformat.validate(notebook)
        assert _cells(jupytext.read(source)) == _cells(notebook), (
            f"{source.name} and its .ipynb differ: run jupytext --to ipynb --execute {source.relative_to(ROOT)}")
        assert notebook.metadata.kernelspec.name == "python3"
        # Committed executed, so the docs show the outputs: every code cell ran, in order.
        counts = [cell.execution_count for cell in notebook.cells if cell.cell_type == "code"]
        assert counts == list(range(1, len(counts) + 1)), (source.name, counts)
        assert not any(output.output_type == "error" for cell in notebook.cells if cell.cell_type == "code"
                       for output in cell.outputs), source.name
    # The kernel the notebooks name exists after `pip install -e '.[test]'` (ipykernel).
    assert KernelSpecManager().get_kernel_spec("python3") is not None


def test_the_pairing_check_can_fail(tmp_path):
    source = SOURCES[0]
    edited = tmp_path / source.name
    edited.write_text(source.read_text(encoding="utf-8").replace("# %%", "# %%\nx = 1\n\n# %%", 1),
                      encoding="utf-8")
    notebook = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    assert _cells(jupytext.read(edited)) != _cells(notebook)


@pytest.mark.parametrize("source", SOURCES, ids=[path.stem for path in SOURCES])
def test_notebook_executes(source, monkeypatch):
    monkeypatch.setenv("JAXROLL_NOTEBOOK_SMOKE", "1")   # the notebook's smaller sizes, the same checks
    if source.stem in NEEDS_TORCH:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    notebook = jupytext.read(source)   # the source, as a reader runs it
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(source.parent)}})
    client.execute()   # raises CellExecutionError, with the cell and traceback, on any error
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.outputs if output.output_type == "error"]
    assert not errors
    # Every figure cell drew its figure.
    for cell in notebook.cells:
        if any(tag.startswith("figure:") for tag in cell.metadata.get("tags", [])):
            assert any("image/png" in output.get("data", {}) for output in cell.outputs), cell.source[:80]
