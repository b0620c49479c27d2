"""The docs site's pages run as written and say what the code does.

- Every ```python block of every page under docs/ runs: the blocks of one
  page in order, in one namespace (as a reader pasting them into one
  session), in a fresh directory. A page added later is picked up by the glob.
  A page whose blocks use torch is skipped only when torch is not installed.
- scripts/check_api_docs.py passes (every public name has a docstring and an
  API page) and fails when a page is missing.
- The glossary defines every statistic the code reports: the fields of
  `metrics.Shape` and `metrics.Comparison`, the sweep table's columns and the
  forces' drifts; the rollout summary prints first_mass / middle_mass /
  last_mass as the glossary defines them (checked in NumPy from the profile
  the command writes).
- One version everywhere: pyproject.toml, CITATION.cff, `jaxroll --version`.
- The site's page check (scripts/mkdocs_hooks.py, run on every page by
  `mkdocs build`) passes a good page and names what is wrong in a page that
  loads from a CDN or shows unrendered math; notebook math becomes MathML.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml

import jaxroll
from jaxroll import metrics, theory

_spec = importlib.util.spec_from_file_location("mkdocs_hooks", Path(__file__).resolve().parent.parent / "scripts"
                                               / "mkdocs_hooks.py")
mkdocs_hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mkdocs_hooks)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
NEEDS_TORCH = re.compile(r"^\s*(import torch|from torch|import transformers|from transformers"
                         r"|from jaxroll import measure|import jaxroll\.measure|from jaxroll\.measure)", re.M)


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def test_the_pages_are_there():
    names = {path.relative_to(DOCS).as_posix() for path in PAGES}
    for page in ("index.md", "getting-started.md", "concepts.md", "glossary.md", "changelog.md", "cite.md",
                 "development.md", "api/index.md"):
        assert page in names
    assert sum(len(python_blocks(path)) for path in PAGES) >= 5


@pytest.mark.parametrize("path", [p for p in PAGES if python_blocks(p)],
                         ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_python_blocks_run_as_written(path, tmp_path, monkeypatch):
    blocks = python_blocks(path)
    if any(NEEDS_TORCH.search(block) for block in blocks) and importlib.util.find_spec("torch") is None:
        pytest.skip("the page's code needs torch (the measure extra)")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for index, block in enumerate(blocks):
        name = f"{path.relative_to(ROOT)} (python block {index + 1})"
        if path.name not in PRINTED_PAGES:
            exec(compile(block, name, "exec"), namespace)
            continue
        lines = block.splitlines()
        for statement in ast.parse(block).body:  # one at a time, so each print is read on its own
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(ast.Module([statement], []), name, "exec"), namespace)
            after = lines[statement.end_lineno] if statement.end_lineno < len(lines) else ""
            if after.startswith("# ") and isinstance(statement, ast.Expr) and \
                    getattr(statement.value.func, "id", None) == "print":
                assert printed.getvalue().strip() == after[2:].strip(), (name, statement.lineno)


# Pages whose ``print(...)`` followed by a line ``# OUTPUT`` show what it prints: checked, digit for digit.
PRINTED_PAGES = ("design-interventions.md",)


def cli_blocks(path: Path) -> list[str]:
    """The ```bash blocks that run on the committed models: their first line sets ``M=validation/models/...``."""
    blocks = re.findall(r"^```bash\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return [block for block in blocks if block.startswith("M=validation/models/")]


@pytest.mark.parametrize("path", [p for p in PAGES if cli_blocks(p)], ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_commands_run_as_written_on_the_committed_models(path, tmp_path, monkeypatch, capsys):
    """Every command of the page's runnable blocks (`cli_blocks`), line by line as a shell would read it (``\\``
    continues a line, ``#`` starts a comment, ``$M`` the committed models), in a fresh directory: each exits 0."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from jaxroll.cli import main

    monkeypatch.chdir(tmp_path)
    for block in cli_blocks(path):
        variables = {}
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and "=" in words[0] and not words[0].startswith("-"):
                name, _, value = words[0].partition("=")
                variables[name] = str(ROOT / value)
                continue
            if not words:
                continue
            assert words[0] == "jaxroll", line
            argv = [re.sub(r"\$(\w+)", lambda match: variables[match[1]], word) for word in words[1:]]
            status = main(argv)
            assert status == 0, (line, capsys.readouterr().err)


def test_every_public_name_is_documented():
    pytest.importorskip("griffe")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_api_docs.py")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_api_check_fails_when_a_page_is_missing(tmp_path):
    pytest.importorskip("griffe")
    (tmp_path / "jaxroll").symlink_to(ROOT / "jaxroll", target_is_directory=True)
    shutil.copytree(DOCS / "api", tmp_path / "docs" / "api")
    (tmp_path / "docs" / "api" / "theory.md").unlink()   # jaxroll.theory and jaxroll.metrics
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_api_docs.py"), "--root", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert "jaxroll.theory: public module with __all__ on no API page" in result.stderr
    assert "jaxroll.metrics: public module" in result.stderr


def _glossary() -> tuple[set[str], str]:
    text = (DOCS / "glossary.md").read_text(encoding="utf-8")
    return set(re.findall(r"\{#([\w-]+)\}", text)), text


def test_the_glossary_defines_every_reported_statistic():
    anchors, text = _glossary()
    for name in metrics.Shape._fields + tuple(f for f in metrics.Comparison._fields if f not in ("p", "q")):
        assert name in anchors, name
    assert "total_mixing" in anchors and "drift" in anchors
    for name in ("drift_center_of_mass", "drift_first", "drift_last"):
        assert name in theory.Forces._fields and f"`{name}`" in text
    table = jaxroll.sweep(jaxroll.presets.get("mpt-7b"), lambda_0=[0.3], beta=[1.0], lengths=[16],
                          progress=False).table
    for column in table:
        axis = next((a for a in ("lambda_0", "beta") if column in (a, f"{a}_index")), None)
        assert axis or column in anchors, column   # axis columns are the `<axis>`, `<axis>_index` rows
    assert "`<axis>_index`" in text and "`<axis>`" in text


def test_rollout_summary_prints_the_glossary_masses(tmp_path, capsys):
    from jaxroll.cli import main

    assert main(["rollout", "--preset", "mpt-7b", "--length", "50", "--out", str(tmp_path / "out"), "--float64"]) == 0
    printed = capsys.readouterr().out
    match = re.search(r"first_mass / middle_mass / last_mass = (\S+) / (\S+) / (\S+)", printed)
    assert match, printed
    p = np.loadtxt(tmp_path / "out" / "profile.csv", delimiter=",", skiprows=1)[:, 1]
    k = max(1, round(0.1 * p.size))   # the glossary's k: 5 of 50 positions
    expected = (p[:k].sum(), p[k:p.size - k].sum(), p[-k:].sum())
    # Printed with 6 significant digits.
    np.testing.assert_allclose([float(value) for value in match.groups()], expected, rtol=1e-5)
    assert abs(sum(expected) - 1) < 1e-12


def test_one_version_everywhere():
    with open(ROOT / "pyproject.toml", "rb") as file:
        version = tomllib.load(file)["project"]["version"]
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert str(citation["version"]) == version
    assert "2602.16837" in str(citation["preferred-citation"])
    printed = subprocess.run([sys.executable, "-m", "jaxroll", "--version"], capture_output=True, text=True)
    assert printed.returncode == 0 and printed.stdout.split() == ["jaxroll", jaxroll.__version__]
    assert jaxroll.__version__ == version
    assert "MIT License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert (ROOT / "jaxroll" / "data" / "published" / "LICENSE").is_file()
    assert (ROOT / "jaxroll" / "py.typed").is_file()


GOOD_PAGE = """<!doctype html><html><head>
<link rel="stylesheet" href="../assets/stylesheets/main.css"><link rel="canonical" href="https://example.org/jaxroll/">
<script src="../assets/javascripts/bundle.js"></script><style>body { background: url(img/bg.png); }</style>
</head><body><p>Costs $5 and $6; see <a href="https://arxiv.org/abs/2602.16837">the paper</a>.</p>
<span class="math-display"><math display="block"><msub><mi>R</mi><mi>t</mi></msub></math></span>
<pre><code>echo "$$" '\\(' and $\\lambda$</code></pre><p>inline <code>$$</code> is code</p></body></html>"""


def test_page_check_passes_a_good_page():
    assert mkdocs_hooks.offline_problems(GOOD_PAGE) == []


@pytest.mark.parametrize("tag, url", [
    ('<script src="https://cdn.jsdelivr.net/npm/katex@0.16/dist/katex.min.js"></script>', "cdn.jsdelivr.net"),
    ('<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">', "fonts.googleapis.com"),
    ('<link rel="preconnect" href="https://fonts.gstatic.com">', "fonts.gstatic.com"),
    ('<img src="//cdn.example.org/logo.png">', "cdn.example.org"),
    ("<style>@import url('https://fonts.googleapis.com/x.css');</style>", "fonts.googleapis.com"),
    ('<script type="module">const u = "https://cdnjs.cloudflare.com/m.mjs"; await import(u);</script>', "cdnjs"),
])
def test_page_check_names_a_network_load(tag, url):
    problems = mkdocs_hooks.offline_problems(GOOD_PAGE.replace("</head>", tag + "</head>"))
    assert len(problems) == 1 and url in problems[0], problems


@pytest.mark.parametrize("text", [r"$$R_t = (1 - \lambda_t) I$$", r"\(p_T\)", r"\[x\]", r"with $\lambda_t$ here"])
def test_page_check_names_unrendered_math(text):
    problems = mkdocs_hooks.offline_problems(GOOD_PAGE.replace("<p>inline", f"<p>{text}</p><p>inline"))
    assert len(problems) == 1 and "unrendered math" in problems[0], problems


def test_notebook_math_becomes_mathml_and_the_cdn_loader_goes():
    cell = (r"<p>Each layer: $$R_t = (1 - \lambda_t)\, I + \lambda_t A_t,$$ and $p_T &lt; 1$ costs $5.</p>"
            r"<pre>print('$$')</pre>")
    loader = ('<script type="module">document.addEventListener("x", async () => {const mermaid = '
              '(await import("https://cdnjs.cloudflare.com/m.mjs")).default;});</script>')
    assert len(mkdocs_hooks.offline_problems(loader + cell)) == 2   # the CDN and the paragraph
    content = mkdocs_hooks.render_dollars(mkdocs_hooks.NOTEBOOK_LOADERS.sub("", loader + cell))
    assert mkdocs_hooks.offline_problems(content) == []
    assert content.count("<math") == 2 and 'display="block"' in content and "<pre>print('$$')</pre>" in content
    assert "&#x003BB;" in content and "&#x0003C;" in content and "costs $5." in content   # lambda, "<", the price


def test_markdown_math_becomes_mathml():
    content = mkdocs_hooks.render_arithmatex('<p>so <span class="arithmatex">\\(a_t &lt; b\\)</span></p>'
                                             '<div class="arithmatex">\\[\nP_T = R_T \\cdots R_1\n\\]</div>')
    assert mkdocs_hooks.offline_problems(content) == []
    assert content.count("<math") == 2 and content.count('<span class="math-display">') == 1


@pytest.mark.parametrize("tex", [r"\lamda_t", r"a_{"])
def test_a_formula_that_cannot_render_is_refused(tex):
    # latex2mathml passes an unknown command through as text; the hook makes it a build error.
    with pytest.raises(ValueError, match="cannot render"):
        mkdocs_hooks.mathml(tex, display=False)


NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
           "sixteen").split()


def test_every_page_counts_the_notebooks_there_are():
    """"Eight executed walk-throughs": every number word before notebooks or walk-throughs, on the README and
    every page but the changelog (a history), is the count of notebooks/*.ipynb."""
    count = len(list((ROOT / "notebooks").glob("*.ipynb")))
    said = re.compile(r"\b(" + "|".join(NUMBERS) + r")\s+(?:short\s+|executed\s+|jupyter\s+)*"
                      r"(?:notebooks|walk-throughs)\b", re.I)
    found = []
    for path in [ROOT / "README.md", *PAGES]:
        if path.name == "changelog.md":
            continue
        for match in said.finditer(path.read_text(encoding="utf-8")):
            found.append((path.name, match[0]))
            assert NUMBERS.index(match[1].lower()) == count, (path.name, match[0], count)
    assert len(found) >= 3, found  # the README, getting-started.md and notebooks.md say it


def test_only_the_readme_counts_the_tests():
    """The suite's size is stated once, in the README (the lead updates it after a full run); a second count on
    another page drifts (1887 against 1173)."""
    count = re.compile(r"\b\d[\d,]*\s+tests\b")
    assert count.search((ROOT / "README.md").read_text(encoding="utf-8"))
    for path in PAGES:
        if path.name != "changelog.md":
            assert not count.search(path.read_text(encoding="utf-8")), path.name
