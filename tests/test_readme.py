"""The README, the front page: its Python example runs as written, and it stays a front page.

Every ```python block is executed in order in one namespace, in a fresh
directory, as a reader pasting them into one session would; a block that
raises fails the test. The README names the two commands (install and run
the main job; install, test and build the docs), stays short (the user guide
is under docs/), and every relative link in it points at a file of the
repository.
"""

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 200


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_is_a_front_page_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES
    bash = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    # --force: the main job reruns into its own results/ (without it the second run is refused)
    assert "python3 -m pip install -e . && jaxroll rollout --out results --force\n" in bash
    assert ("python3 -m pip install -e '.[test,docs]' && python3 -m pytest -q && mkdocs build --strict\n"
            in bash)
    for extra in ("measure", "sweep", "docs", "test"):   # the install extras of pyproject.toml
        assert f"| `{extra}` |" in text
    assert "/".join(("..", "shared")) not in text   # a clone has none


def test_readme_links_point_at_files_of_the_repository():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        assert (ROOT / link).exists(), link


def test_readme_has_a_quick_start_that_reads_no_files_outside_the_package():
    blocks = python_blocks()
    assert blocks and "jaxroll.published.load" in blocks[0]
    assert len(blocks[0].strip().splitlines()) <= 12   # "a ten-line Python example"


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


def test_the_main_job_runs_again_into_its_own_folder(tmp_path, monkeypatch, capsys):
    """The README's first command, as written, twice in one folder: both exit 0 (a rerun without --force is
    refused, as nothing written is overwritten unasked)."""
    from jaxroll.cli import main

    bash = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    command = next(block for block in bash if "jaxroll rollout" in block).strip().split(" && ")[-1].split()
    assert command[0] == "jaxroll"
    monkeypatch.chdir(tmp_path)
    assert main(command[1:]) == 0 and main(command[1:]) == 0, capsys.readouterr().err
    assert (tmp_path / "results" / "profile.csv").is_file()
    assert main([word for word in command[1:] if word != "--force"]) == 2
