"""Copy the paper authors' published configurations into the package, byte for byte.

    python scripts/copy_published.py SOURCE_DIR [SOURCE_2048_DIR]

SOURCE_DIR is the authors' ``reference-configs`` tree (``rollout/``,
``empirical/``, ``LICENSE``); SOURCE_2048_DIR, when given, is their
``reference-configs-2048`` tree (``rollout/alibi/no_content_2048/``,
``rollout/alibi/all_content_2048/<dataset>/``, the same ``LICENSE``), whose
folders land beside the older ones under ``rollout/alibi/``. The copy lands in
``jaxroll/data/published/``; its ``README.md`` (the attribution) is the
project's own and is kept. ``tests/test_published.py`` checks the copy
against both sources when they are available.
"""

import filecmp
import shutil
import sys
from pathlib import Path

TARGET = Path(__file__).resolve().parents[1] / "jaxroll" / "data" / "published"


def copy_base(source: Path) -> None:
    if not (source / "rollout").is_dir():
        sys.exit(f"{source}: no rollout/ directory; allowed: the authors' reference-configs tree")
    for name in ("rollout", "empirical"):
        shutil.rmtree(TARGET / name, ignore_errors=True)
        shutil.copytree(source / name, TARGET / name)
    shutil.copyfile(source / "LICENSE", TARGET / "LICENSE")


def copy_2048(source: Path) -> None:
    folders = sorted(p for p in (source / "rollout" / "alibi").glob("*_2048") if p.is_dir())
    if not folders:
        sys.exit(f"{source}: no rollout/alibi/*_2048 directory; allowed: the authors' reference-configs-2048 tree")
    # One licence file serves both trees; refuse to ship the new files under another one.
    if not filecmp.cmp(source / "LICENSE", TARGET / "LICENSE", shallow=False):
        sys.exit(f"{source / 'LICENSE'}: differs from {TARGET / 'LICENSE'}; allowed: the same licence")
    for folder in folders:
        shutil.rmtree(TARGET / "rollout" / "alibi" / folder.name, ignore_errors=True)
        shutil.copytree(folder, TARGET / "rollout" / "alibi" / folder.name)


def main(sources: list[Path]) -> None:
    copy_base(sources[0])
    if len(sources) > 1:
        copy_2048(sources[1])
    count = sum(1 for _ in (TARGET / "rollout").rglob("*.yaml"))
    print(f"copied {count} rollout YAML files from {', '.join(map(str, sources))} into {TARGET}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main([Path(argument) for argument in sys.argv[1:]])
