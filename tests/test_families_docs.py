"""The supported-family table in docs/measuring.md is the one generated from `jaxroll.measure.families`."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from jaxroll.measure.family_table import TABLE_END, TABLE_START, family_table  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "measuring.md"


def test_docs_family_table_is_the_generated_one():
    text = DOCS.read_text(encoding="utf-8")
    start, end = text.index(TABLE_START), text.index(TABLE_END) + len(TABLE_END)
    assert text[start:end] == family_table(), (
        "regenerate: python -m jaxroll.measure.family_table docs/measuring.md")


def test_every_family_row_names_its_position_encoding_and_statistics():
    from jaxroll.measure.families import FAMILIES

    table = family_table()
    for name, layer_map in FAMILIES.items():
        row = next(line for line in table.splitlines() if f"`{name}`" in line)
        assert "lambda" in row and "influence" in row and "attention" in row
        assert ("content" in row) == (layer_map.position != "rope"), row
