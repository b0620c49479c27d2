"""The published configurations shipped as package data: exact copies of the
authors' files, `jaxroll.published.load` with its documented meaning, and
one-line errors for unknown names."""

import filecmp
import os
from pathlib import Path

import numpy as np
import pytest

import jaxroll
from jaxroll import ConfigError, published

import oracle

# The authors' tree the package data was copied from, where a checkout has it
# beside it (the project's CI does; a user's clone does not, and skips).
SOURCE = Path(os.environ.get("JAXROLL_REFERENCE_CONFIGS",
                             Path(__file__).resolve().parents[1].parent / "shared" / "reference-configs"))


def test_package_data_is_complete():
    files = published.rollout_files()
    assert len(files) == 33
    assert (published.ROOT / "LICENSE").read_text().startswith("MIT License")
    assert "Machine Learning Group @ University of Hamburg" in (published.ROOT / "LICENSE").read_text()
    assert len(list((published.ROOT / "empirical").rglob("*.yaml"))) == 26


@pytest.mark.skipif(not SOURCE.is_dir(), reason="the authors' source tree is not beside this checkout")
def test_package_data_equals_the_authors_files_byte_for_byte():
    source = sorted(p.relative_to(SOURCE) for p in SOURCE.rglob("*") if p.is_file() and p.name != "README.md")
    shipped = sorted(p.relative_to(published.ROOT) for p in published.ROOT.rglob("*")
                     if p.is_file() and p.name != "README.md")
    assert shipped == source
    mismatched = [str(p) for p in source if not filecmp.cmp(SOURCE / p, published.ROOT / p, shallow=False)]
    assert mismatched == []


@pytest.mark.parametrize("name", published.names())
@pytest.mark.parametrize("content, dataset, folder", [
    (None, "fineweb-edu", "no_content"),
    ("mean", "fineweb-edu", "mean_content/fineweb-edu"),
    ("all", "fineweb-edu", "all_content/fineweb-edu"),
    ("all", "dclm", "all_content/dclm"),
    ("all", "wikipedia", "all_content/wikipedia"),
])
def test_load_reads_the_file_of_that_measurement(name, content, dataset, folder):
    stem = {"bloom-176b": "bloom"}.get(name, name)
    path = published.ROOT / "rollout" / "alibi" / folder / f"{stem}.yaml"
    model = published.load(name, content, dataset)
    expected = oracle.config_arrays(oracle.read_config(path))
    np.testing.assert_array_equal(model.lambdas, expected["lambdas"])
    np.testing.assert_array_equal(model.alibi_slopes, expected["slopes"])
    np.testing.assert_array_equal(model.diagonal_scores, expected["diagonal"])


@pytest.mark.parametrize("name", published.names())
def test_no_residual_equals_the_authors_noresidual_file(name):
    stem = {"bloom-176b": "bloom"}.get(name, name)
    path = published.ROOT / "rollout" / "alibi" / "no_content" / f"{stem}-noresidual.yaml"
    model = published.load(name, residual=False)
    expected = jaxroll.load_config(path)
    np.testing.assert_array_equal(model.lambdas, np.ones(expected.num_layers))
    np.testing.assert_array_equal(model.lambdas, expected.lambdas)
    np.testing.assert_array_equal(model.alibi_slopes, expected.alibi_slopes)


def test_no_content_on_another_dataset_keeps_its_lambdas_and_drops_content():
    with_content = oracle.config_arrays(oracle.read_config(
        published.ROOT / "rollout/alibi/all_content/dclm/mpt-7b.yaml"))
    model = published.load("mpt-7b", None, "dclm")
    np.testing.assert_array_equal(model.lambdas, with_content["lambdas"])
    assert not np.any(model.diagonal_scores) and not np.any(model.base_scores)
    fineweb = published.load("mpt-7b")
    assert not np.array_equal(model.lambdas, fineweb.lambdas)


def test_published_schedules_are_measured_not_the_power_decay_presets():
    measured = np.asarray(published.load("mpt-7b").lambdas)
    preset = np.asarray(jaxroll.presets.get("mpt-7b").lambdas)
    assert measured.shape == preset.shape
    assert np.max(np.abs(measured - preset)) > 1e-2
    # The preset keeps the measured total mixing (README, presets).
    assert abs(preset.sum() / measured.sum() - 1) < 1e-3


@pytest.mark.parametrize("call, message", [
    (lambda: published.load("gpt-5"), "published model: got 'gpt-5'; allowed: one of bloom-176b, bloom-7b1, mpt-7b"),
    (lambda: published.load("mpt-7b", "some"), "content: got 'some'; allowed: one of None, 'mean', 'all'"),
    (lambda: published.load("mpt-7b", "all", "c4"), "dataset: got 'c4'; allowed: one of fineweb-edu, dclm, wikipedia"),
    (lambda: published.load("mpt-7b", "mean", "dclm"), "dataset: got 'dclm' with content='mean'; allowed: 'fineweb-edu'"),
])
def test_unknown_values_are_one_line_errors(call, message):
    with pytest.raises(ConfigError) as error:
        call()
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)
