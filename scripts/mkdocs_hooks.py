"""mkdocs hooks for the jaxroll site (``hooks:`` in mkdocs.yml).

- The site's name carries the package version, read from pyproject.toml, so
  the docs show the version `jaxroll --version` prints without importing
  (or installing) the package.
- The walk-through notebooks live in ``notebooks/`` at the repository root
  (beside their jupytext sources); they are added to the site as
  ``notebooks/NN_name.ipynb`` before mkdocs-jupyter renders them (with the
  outputs they were committed with; nothing is executed at build time).
  The validation figure stays beside validation/run.py, which writes it.
- Math is rendered at build time to MathML (latex2mathml), so pages need no
  script and no font from anywhere: in Markdown pages pymdownx.arithmatex
  (generic mode) marks ``$...$`` and ``$$...$$`` as ``\\(...\\)`` and
  ``\\[...\\]``; in notebook pages the markdown cells keep ``$...$`` and
  ``$$...$$`` as written. mkdocs-jupyter's MathJax and Mermaid loaders (a
  CDN script and an empty one) are removed from notebook pages.
- Every built page is checked (`offline_problems`): a page that loads
  anything from the network, or shows unrendered math, fails the build.

The checks need only the standard library, so tests/test_docs.py runs them
without the docs extra.
"""

from __future__ import annotations

import html
import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path

try:  # the docs extra; the page checks below need only the standard library
    from mkdocs.plugins import event_priority
except ImportError:  # pragma: no cover - imported by tests without mkdocs
    def event_priority(priority):
        return lambda method: method

ROOT = Path(__file__).resolve().parent.parent


def version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]["version"]


# ---------------------------------------------------------------------------------------------
# Math: TeX -> MathML at build time.

# pymdownx.arithmatex (generic: true) output: \(...\) in a span, \[...\] in a div.
ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">\s*\\([(\[])(.*?)\\[)\]]\s*</\1>', re.S)
# Notebook markdown cells: $$...$$ (display), then $...$ (inline, not touching spaces, no digit
# after the closing $ so that prices like $5 stay text).
NOTEBOOK_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
NOTEBOOK_INLINE = re.compile(r"(?<![\\$])\$(?=\S)([^$\n]+?)(?<=\S)\$(?!\d)")
# Elements whose text is code, not prose: math inside them stays as written.
VERBATIM = re.compile(r"(<(pre|code|script|style|textarea)\b.*?</\2>)", re.S | re.I)
# mkdocs-jupyter (nbconvert) script blocks: MathJax's (an empty src and its config) and the
# Mermaid loader, which imports from a CDN when a notebook has a diagram (these have none).
NOTEBOOK_LOADERS = re.compile(
    r'<script src="">\s*</script>|<!-- MathJax configuration -->\s*<script type="text/x-mathjax-config">'
    r'.*?</script>\s*<!-- End of mathjax configuration -->|<script type="module">(?:(?!</script>).)*?mermaid.*?</script>',
    re.S)


def mathml(tex: str, display: bool) -> str:
    """MathML for one TeX formula (HTML entities in ``tex`` are decoded first).

    Display formulas are wrapped in ``<span class="math-display">``, a block that
    scrolls sideways when the formula is wider than the page
    (docs/stylesheets/extra.css); a span, because in notebooks a display formula
    sits inside a paragraph, where a div is not allowed.
    """
    from latex2mathml.converter import convert

    tex = html.unescape(tex).strip()
    try:
        markup = convert(tex, display="block" if display else "inline")
    except Exception as error:  # latex2mathml raises its own exception types, all unhelpful alone
        raise ValueError(f"cannot render ${tex}$: {type(error).__name__} {error}") from None
    # latex2mathml passes an unknown command through as text (<mi>\lamda</mi>).
    unknown = re.search(r">([^<]*\\[^<]*)<", markup)
    if unknown:
        raise ValueError(f"cannot render ${tex}$: unknown command {unknown.group(1)}")
    return f'<span class="math-display">{markup}</span>' if display else markup


def render_arithmatex(content: str) -> str:
    """Replace pymdownx.arithmatex's generic spans and divs with MathML."""
    return ARITHMATEX.sub(lambda m: mathml(m.group(3), display=m.group(2) == "["), content)


def render_dollars(content: str) -> str:
    """Replace ``$$...$$`` and ``$...$`` in text (not in code, scripts or styles) with MathML."""
    def prose(text: str) -> str:
        text = NOTEBOOK_DISPLAY.sub(lambda m: mathml(m.group(1), display=True), text)
        return NOTEBOOK_INLINE.sub(lambda m: mathml(m.group(1), display=False), text)

    parts = VERBATIM.split(content)
    # split() with two groups yields [text, element, tag name, text, element, tag name, ...].
    return "".join(prose(part) if index % 3 == 0 else part if index % 3 == 1 else ""
                   for index, part in enumerate(parts))


# ---------------------------------------------------------------------------------------------
# The page check: nothing from the network, no unrendered math.

REMOTE = re.compile(r"^\s*(https?:)?//", re.I)
REMOTE_IN_TEXT = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"]|import\(\s*['"]|from\s+['"]|fetch\(\s*['"])"""
                            r"""((?:https?:)?//[^'")\s]+)""", re.I)
# In an inline script any remote URL in a string counts (it is there to be fetched: the Mermaid
# loader keeps one in a variable before import()ing it), except XML namespace names (w3.org).
SCRIPT_URL = re.compile(r"""['"`]((?:https?:)?//(?!www\.w3\.org/)[\w.-]+[^'"`\s]*)""", re.I)
RAW_MATH = re.compile(r"\$\$|\\\(|\\\[|\$\\[A-Za-z]")
# Attributes through which an element fetches something when the page loads.
LOADING = {"src", "srcset", "data", "poster", "background", "formaction"}
# <link rel=...> kinds that only name a URL (no request is made for them).
LINK_NAMES_ONLY = {"canonical", "alternate", "author", "license", "help", "next", "prev", "search"}
NOT_PROSE = {"pre", "code", "script", "style", "textarea", "math", "svg", "kbd", "samp"}


class _PageScan(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = {name: value or "" for name, value in attrs}
        for name, value in attrs.items():
            urls = [part.split()[0] for part in value.split(",") if part.strip()] if name == "srcset" else [value]
            if name in LOADING and any(REMOTE.match(url) for url in urls):
                self.problems.append(f"<{tag} {name}={value!r}> loads from the network")
        rel = set(attrs.get("rel", "").lower().split())
        if tag == "link" and REMOTE.match(attrs.get("href", "")) and not rel <= LINK_NAMES_ONLY:
            self.problems.append(f"<link rel={attrs.get('rel')!r} href={attrs['href']!r}> loads from the network")
        for url in REMOTE_IN_TEXT.findall(attrs.get("style", "")):
            self.problems.append(f"<{tag} style=...> loads {url}")
        if tag not in ("br", "img", "input", "link", "meta", "hr", "source", "wbr", "area", "base", "col",
                       "embed", "param", "track"):
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if self.open and self.open[-1] == tag:
            self.open.pop()

    def handle_endtag(self, tag):
        if tag in self.open:   # browsers close what is left open inside; so do we
            while self.open.pop() != tag:
                pass

    def handle_data(self, data):
        inside = self.open[-1] if self.open else ""
        if inside in ("script", "style"):
            urls = REMOTE_IN_TEXT.findall(data) + (SCRIPT_URL.findall(data) if inside == "script" else [])
            for url in dict.fromkeys(urls):
                self.problems.append(f"<{inside}> loads {url}")
        elif not NOT_PROSE.intersection(self.open):
            match = RAW_MATH.search(data)   # one line per run of text is enough to find it
            if match:
                context = data[max(0, match.start() - 30):match.end() + 30].replace("\n", " ")
                self.problems.append(f"unrendered math {match.group()!r} in the text: ...{context}...")


def offline_problems(page_html: str) -> list[str]:
    """What is wrong with one built page, one line each (empty when nothing is).

    A page is wrong when it loads anything from the network (a ``src``,
    ``srcset`` or ``<link href>`` that is ``http(s)://`` or ``//``; a ``url(...)``,
    ``@import`` of one in a style; any remote URL in a script's strings), or when its text
    (outside code, scripts, styles and MathML) shows unrendered math: ``$$``,
    ``\\(``, ``\\[`` or ``$\\command``. Links a reader follows (``<a href>``) are fine.
    """
    scan = _PageScan()
    scan.feed(page_html)
    scan.close()
    return scan.problems


def stylesheet_problems(css: str) -> list[str]:
    """The network loads in one stylesheet (``url(...)`` or ``@import`` of a remote URL)."""
    return [f"loads {url}" for url in REMOTE_IN_TEXT.findall(css)]


# ---------------------------------------------------------------------------------------------
# The hooks.

def on_config(config):
    config.site_name = f"jaxroll {version()}"
    return config


@event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files, config):
    from mkdocs.structure.files import File

    paths = [*sorted((ROOT / "notebooks").glob("*.ipynb")), ROOT / "validation" / "validation.png"]
    for path in paths:
        files.append(File(path.relative_to(ROOT).as_posix(), src_dir=str(ROOT), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files


@event_priority(-100)  # after mkdocs-jupyter has put the notebook's HTML in the page
def on_page_content(content, page, config, files):
    try:
        if page.file.src_uri.endswith(".ipynb"):
            return render_dollars(NOTEBOOK_LOADERS.sub("", content))
        return render_arithmatex(content)
    except ValueError as error:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{page.file.src_uri}: {error}") from None


def on_post_page(output, page, config):
    problems = offline_problems(output)
    if problems:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{page.file.src_uri}: " + "; ".join(problems))
    return output


def on_post_build(config):
    problems = [f"{path.relative_to(config.site_dir)}: {problem}"
                for path in sorted(Path(config.site_dir).rglob("*.css"))
                for problem in stylesheet_problems(path.read_text(encoding="utf-8", errors="replace"))]
    if problems:
        from mkdocs.exceptions import PluginError

        raise PluginError("; ".join(problems))
