"""Copy the paper authors' published configurations into the package, byte for byte.

    python scripts/copy_published.py SOURCE_DIR

SOURCE_DIR is the authors' ``reference-configs`` tree (``rollout/``,
``empirical/``, ``LICENSE``). The copy lands in ``jaxroll/data/published/``;
its ``README.md`` (the attribution) is the project's own and is kept.
``tests/test_published.py`` checks the copy against the source when the source
is available.
"""

import shutil
import sys
from pathlib import Path

TARGET = Path(__file__).resolve().parents[1] / "jaxroll" / "data" / "published"


def main(source: Path) -> None:
    if not (source / "rollout").is_dir():
        sys.exit(f"{source}: no rollout/ directory; allowed: the authors' reference-configs tree")
    for name in ("rollout", "empirical"):
        shutil.rmtree(TARGET / name, ignore_errors=True)
        shutil.copytree(source / name, TARGET / name)
    shutil.copyfile(source / "LICENSE", TARGET / "LICENSE")
    count = sum(1 for _ in TARGET.rglob("*.yaml"))
    print(f"copied {count} YAML files from {source} into {TARGET}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
