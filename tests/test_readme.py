"""The README's Python examples run as written, in a fresh directory.

Every ```python block is executed in order in one namespace, as a reader
pasting them into one session would; a block that raises fails the test.
"""

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_a_quick_start_that_reads_no_files_outside_the_package():
    blocks = python_blocks()
    assert blocks and "jaxroll.published.load" in blocks[0]
    assert "/".join(("..", "shared")) not in README.read_text(encoding="utf-8")  # a clone has none


def test_readme_python_blocks_run_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in python_blocks():
        exec(compile(block, str(README), "exec"), namespace)
    printed = capsys.readouterr().out.split()
    # The quick start prints p[0], p[-1] and the argmin of MPT-7B's measured
    # profile, then the attention-only p[0]: a U (both ends above the
    # minimum, interior argmin) and a near-total collapse.
    first, last, lowest, collapsed = float(printed[0]), float(printed[1]), int(printed[2]), float(printed[3])
    profile = namespace["p"]
    assert 0 < lowest < len(profile) - 1
    assert first > float(profile[lowest]) and last > float(profile[lowest])
    assert collapsed > 0.99
    assert abs(float(np.sum(profile)) - 1) < 1e-6
    assert (tmp_path / "profile.csv").is_file()
