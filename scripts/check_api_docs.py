"""Check that every public name is documented: a docstring, and a place on an API page.

The public names are ``jaxroll.__all__`` and the ``__all__`` of every public
module (a module of the ``jaxroll`` package whose dotted path has no part
starting with ``_``). The API pages are ``docs/api/*.md``; a line
``::: jaxroll.X`` there renders module ``jaxroll.X`` with the names of its
``__all__`` (mkdocstrings), and, unless its options say
``show_submodules: false``, its public submodules too (``mkdocs.yml`` turns
``show_submodules`` on).

A name fails when
- it has no docstring (a function, class or module without one; a constant
  without the string literal under it that documents an attribute: without
  one mkdocstrings leaves the name off the page), or
- it is not rendered on any page: for a module's ``__all__``, the module is on
  no page; for ``jaxroll.__all__`` (whose page lists the names without their
  documentation), the object is neither a module on a page nor in the
  ``__all__`` of a module on a page (or a public name of a module on a page
  that has no ``__all__``).

The package is read from the source with griffe, as mkdocstrings reads it, so
the check needs neither the optional extras nor an import of jaxroll.

    python3 scripts/check_api_docs.py [--root DIR]

Exit status 1 with one line per problem, 0 when everything is documented.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parent.parent
DIRECTIVE = re.compile(r"^:::\s*(jaxroll[\w.]*)\s*$")


def directives(api_dir: Path) -> dict[str, bool]:
    """``{module path: renders its submodules}`` for every ``:::`` line of the API pages."""
    found: dict[str, bool] = {}
    for page in sorted(api_dir.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for index, line in enumerate(lines):
            match = DIRECTIVE.match(line.strip())
            if not match:
                continue
            options = []
            for following in lines[index + 1:]:
                if following and not following.startswith(" "):
                    break
                options.append(following.strip())
            found[match.group(1)] = "show_submodules: false" not in options
    return found


def public_modules(package: griffe.Module):
    """The package and every submodule whose path has no part starting with ``_``."""
    yield package
    for member in package.modules.values():
        if not member.is_alias and not member.name.startswith("_"):  # not `from . import memory`
            yield from public_modules(member)


def exported(module: griffe.Module) -> list[str]:
    names = module.exports
    return sorted(str(name) for name in names) if names else []


def is_rendered(path: str, pages: dict[str, bool]) -> bool:
    """Module ``path`` is on a page itself or under a package page that shows submodules."""
    if path in pages:
        return True
    parts = path.split(".")
    return any(pages.get(".".join(parts[:k])) for k in range(2, len(parts)))


def check(root: Path = ROOT) -> list[str]:
    package = griffe.load("jaxroll", search_paths=[str(root)], resolve_aliases=True,
                          resolve_external=False)
    assert isinstance(package, griffe.Module)
    pages = directives(root / "docs" / "api")
    problems = []
    for path in pages:
        try:
            package[path.removeprefix("jaxroll.")] if path != "jaxroll" else package
        except KeyError:
            problems.append(f"docs/api: ::: {path} names no module of the package")
    for module in public_modules(package):
        names = exported(module)
        if not names:
            continue
        top = module.path == "jaxroll"
        if not top and not is_rendered(module.path, pages):
            problems.append(f"{module.path}: public module with __all__ on no API page "
                            f"(add '::: {module.path}' to a page under docs/api/)")
            continue
        for name in names:
            if name.startswith("__") and name.endswith("__"):
                continue  # __version__ and the like: described in prose on docs/api/index.md
            label = f"{module.path}.{name}"
            if name not in module.members:
                problems.append(f"{label}: in __all__ but not defined")
                continue
            member = module.members[name]
            try:
                target = member.final_target if member.is_alias else member
            except griffe.AliasResolutionError:
                problems.append(f"{label}: cannot resolve where it is defined")
                continue
            if not documented(target):
                problems.append(f"{label}: no docstring")
            if top and not _rendered_name(target, pages):
                problems.append(f"{label}: on no API page (its module {target.parent.path if target.parent else '?'} "
                                f"is on none, or does not list it in __all__)")
    return problems


def documented(target) -> bool:
    # mkdocstrings renders no object without a docstring (show_if_no_docstring
    # is off), so an undocumented name is missing from its page as well.
    return target.docstring is not None and bool(target.docstring.value.strip())


def _rendered_name(target, pages: dict[str, bool]) -> bool:
    if target.is_module:
        return is_rendered(target.path, pages)
    parent = target.parent
    if parent is None or not is_rendered(parent.path, pages):
        return False
    # mkdocstrings renders a module's __all__, or, without one, its public names.
    names = exported(parent)
    return target.name in names if names else not target.name.startswith("_")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    problems = check(args.root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} public names undocumented", file=sys.stderr)
        return 1
    print("every public name has a docstring and an API page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
