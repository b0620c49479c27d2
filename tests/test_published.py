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

# The authors' trees the package data was copied from, where a checkout has
# them beside it (the project's CI does; a user's clone does not, and skips):
# the 256-token tree, and the 2048-token one in the folder beside it.
SOURCE = Path(os.environ.get("JAXROLL_REFERENCE_CONFIGS",
                             Path(__file__).resolve().parents[1].parent / "shared" / "reference-configs"))
SOURCE_2048 = SOURCE.parent / "reference-configs-2048"


def test_package_data_is_complete():
    files = published.rollout_files(None)
    assert len(files) == 53
    assert len(published.rollout_files()) == 33 and len(published.rollout_files(2048)) == 20
    assert set(published.rollout_files()) | set(published.rollout_files(2048)) == set(files)
    assert all(oracle.read_config(p)["sequence_length"] == 2048 for p in published.rollout_files(2048))
    assert (published.ROOT / "LICENSE").read_text().startswith("MIT License")
    assert "Machine Learning Group @ University of Hamburg" in (published.ROOT / "LICENSE").read_text()
    assert len(list((published.ROOT / "empirical").rglob("*.yaml"))) == 26


def _files(root):
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.name != "README.md"}


@pytest.mark.skipif(not (SOURCE.is_dir() and SOURCE_2048.is_dir()),
                    reason="the authors' source trees are not beside this checkout")
def test_package_data_equals_the_authors_files_byte_for_byte():
    # The shipped tree is the union of the two; LICENSE is in both and must be one file.
    source = {p: SOURCE / p for p in _files(SOURCE)}
    source_2048 = {p: SOURCE_2048 / p for p in _files(SOURCE_2048)}
    assert filecmp.cmp(SOURCE / "LICENSE", SOURCE_2048 / "LICENSE", shallow=False)
    assert len(source_2048) == 21  # 20 YAML files and the licence
    source.update(source_2048)
    assert sorted(_files(published.ROOT)) == sorted(source)
    mismatched = [str(p) for p, origin in source.items()
                  if not filecmp.cmp(origin, published.ROOT / p, shallow=False)]
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
@pytest.mark.parametrize("content, dataset, folder", [
    (None, "fineweb-edu", "no_content_2048"),
    ("all", "fineweb-edu", "all_content_2048/fineweb-edu"),
    ("all", "dclm", "all_content_2048/dclm"),
    ("all", "wikipedia", "all_content_2048/wikipedia"),
])
def test_load_at_2048_reads_the_2048_file(name, content, dataset, folder):
    stem = {"bloom-176b": "bloom"}.get(name, name)
    path = published.ROOT / "rollout" / "alibi" / folder / f"{stem}.yaml"
    model = published.load(name, content, dataset, length=2048)
    config = oracle.read_config(path)
    expected = oracle.config_arrays(config)
    assert config["sequence_length"] == model.sequence_length == 2048
    np.testing.assert_array_equal(model.lambdas, expected["lambdas"])
    np.testing.assert_array_equal(model.alibi_slopes, expected["slopes"])
    np.testing.assert_array_equal(model.diagonal_scores, expected["diagonal"])
    np.testing.assert_array_equal(model.base_scores, expected["base"])


def test_catalogue_lists_every_file_of_its_own_once():
    entries = published.catalogue()
    assert len(entries) == len(set(entries)) == 45  # 25 at 256, 20 at 2048
    assert {length for *_, length in entries} == set(published.LENGTHS) == {256, 2048}
    paths = {published.path(*entry) for entry in entries}
    assert len(paths) == 45 and all(p.is_file() for p in paths)
    # The rest of the 53: seven -noresidual twins and the example.
    rest = set(published.rollout_files(None)) - paths
    assert sum("noresidual" in p.name for p in rest) == 7
    assert {p.name for p in rest if "noresidual" not in p.name} == {"example.yaml"}
    assert len(rest) == 8


@pytest.mark.parametrize("n, content, expected", [(1, None, 256), (256, None, 256), (257, "all", 2048),
                                                  (2048, None, 2048), (100, "mean", 256)])
def test_length_for_picks_the_shortest_published_length_that_covers_n(n, content, expected):
    assert published.length_for(n, content) == expected


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
    (lambda: published.load("mpt-7b", length=1024), "length: got 1024; allowed: one of 256, 2048"),
    (lambda: published.load("mpt-7b", "mean", length=2048), "length: got 2048 with content='mean'; allowed: 256"),
    (lambda: published.length_for(2049), "--length 2049: no published configuration that long; allowed: 1 to 2048"),
    (lambda: published.length_for(257, "mean"),
     "--length 257: no published configuration with content 'mean' that long; allowed: 1 to 256"),
])
def test_unknown_values_are_one_line_errors(call, message):
    with pytest.raises(ConfigError) as error:
        call()
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def _cli(capsys, *arguments):
    from jaxroll.cli import main

    status = main([str(a) for a in arguments])
    return status, capsys.readouterr()


def test_cli_published_length_above_256_reads_the_2048_measurement(tmp_path, capsys):
    status, output = _cli(capsys, "rollout", "--published", "bloom-7b1", "--content", "all", "--length", 300,
                          "--float64", "--out", tmp_path / "out")
    assert status == 0, output.err
    assert "published bloom-7b1 (all content, fineweb-edu) measured at N = 2048" in output.out
    path = published.ROOT / "rollout/alibi/all_content_2048/fineweb-edu/bloom-7b1.yaml"
    # Causal: the first 300 positions of the 2048 measurement are its rollout at N = 300.
    expected = oracle.influence_by_correlation(oracle.config_arrays(oracle.read_config(path)), 300)
    np.testing.assert_allclose(jaxroll.read_profile(tmp_path / "out/profile.csv"), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("arguments, message", [
    (("--length", 4096), "--length 4096: no published configuration that long; allowed: 1 to 2048"),
    (("--content", "mean", "--length", 300),
     "--length 300: no published configuration with content 'mean' that long; allowed: 1 to 256"),
])
def test_cli_published_length_without_a_file_is_a_one_line_error(tmp_path, capsys, arguments, message):
    status, output = _cli(capsys, "rollout", "--published", "mpt-7b", *arguments, "--out", tmp_path / "out")
    assert status == 2
    assert message in output.err and output.err.count("\n") == 1
    assert not (tmp_path / "out").exists()
