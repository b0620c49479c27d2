"""Per-case span masses (`jaxroll.task.per_case`, ``compare-task --per-case``): each measured case's own row summed
over its own gold record, averaged per row of an accuracy table (issue 54, the rollout of per-case rows).

Oracles: a NumPy float64 sum over the record's positions, written here as a loop over token indices; SciPy's
Spearman over the held-out rows; the rollout's rows summing to 1 (each ``(1 - lambda) I + lambda A`` is
row-stochastic). Bad input exits 2 with one line and creates nothing.
"""

import json

import numpy as np
import pytest

from jaxroll.errors import ConfigError
from jaxroll.task import external, per_case
from tiny_tokenizer import run_cli

VOCAB = 40
SPANS = {12: [(1, 4), (5, 8), (8, 11)], 16: [(1, 4), (7, 10), (12, 15)]}
"""The gold records of the cases: three depths per length."""


def _cases(lengths=(12, 16), per=3, seed=0):
    """Random prompts (distinct ids) with their gold span, `per` cases per span, both span forms."""
    rng = np.random.default_rng(seed)
    rows = []
    for length in lengths:
        for depth, (start, end) in enumerate(SPANS[length]):
            for sample in range(per):
                row = {"prompt_ids": rng.integers(2, VOCAB, length).tolist(), "answer_ids": [int(rng.integers(2, 9))],
                       "depth_fraction": depth / 2, "sample": sample}
                row.update({"record_start": start, "record_end": end} if sample % 2 else
                           {"depth": start, "record_length": end - start})
                rows.append(row)
    return rows


def rows_of(path):
    """The `Case` objects of a cases file (`jaxroll.task.given.read_cases`)."""
    from jaxroll.task.given import read_cases

    return read_cases(path)


def _write_cases(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _span(row):
    start = row.get("record_start", row.get("depth"))
    return start, row.get("record_end", start + row.get("record_length", 0))


def _fake_measurement(folder, rows, length, seed, stats=("sequence_rollout", "influence"), order=None):
    """A measurement.npz as jaxroll measure writes it: token_ids of the cases at `length` and random rows."""
    rng = np.random.default_rng(seed)
    mine = [row for row in rows if len(row["prompt_ids"]) == length]
    mine = mine if order is None else [mine[i] for i in order]
    arrays = {"token_ids": np.array([row["prompt_ids"] for row in mine], dtype=np.int64)}
    for stat in stats:
        values = rng.uniform(0.01, 1.0, arrays["token_ids"].shape)
        arrays[f"{stat}_per_sequence"] = values / values.sum(1, keepdims=True)
    folder.mkdir()
    np.savez(folder / "measurement.npz", **arrays)
    return arrays


def _table(path, rows, lengths=(12, 16)):
    """An accuracy table with one row per (length, span) of the cases."""
    lines = ["setting,length,start,end,accuracy,n_cases"]
    accuracy = {12: [0.6, 0.2, 0.5], 16: [0.5, 0.1, 0.4]}
    for length in lengths:
        lines += [f"L={length},{length},{s},{e},{y},100" for (s, e), y in zip(SPANS[length], accuracy[length])]
    path.write_text("\n".join(lines) + "\n")
    return path


def _oracle(rows, arrays_by_length, table, key):
    """Each table row's mean, over the measured cases with its span, of their row summed position by position."""
    expected = []
    for length, start, end in zip(table.lengths, table.starts, table.ends):
        arrays = arrays_by_length[int(length)]
        spans = {tuple(row["prompt_ids"]): _span(row) for row in rows if len(row["prompt_ids"]) == length}
        masses = []
        for s, ids in enumerate(arrays["token_ids"].tolist()):
            if spans[tuple(ids)] == (start, end):
                total = 0.0
                for j in range(start, end):
                    total += float(arrays[key][s, j])
                masses.append(total)
        expected.append(sum(masses) / len(masses))
    return np.array(expected)


@pytest.mark.parametrize("rows_kind", ["sequence_rollout", "influence"])
def test_per_case_span_mass_is_the_numpy_sum_over_each_records_positions(tmp_path, rows_kind):
    rows = _cases()
    cases = _write_cases(tmp_path / "cases.jsonl", rows)
    arrays = {12: _fake_measurement(tmp_path / "m12", rows, 12, 1, order=[4, 0, 8, 2, 6, 1, 3, 5, 7]),
              16: _fake_measurement(tmp_path / "m16", rows, 16, 2)}
    table = external.read_accuracy_table(_table(tmp_path / "table.csv", rows))
    result = per_case.compare_per_case(table, [tmp_path / "m16", tmp_path / "m12"], cases, rows=rows_kind,
                                       fit_settings=["L=12"], resamples=50)
    expected = _oracle(rows, arrays, table, f"{rows_kind}_per_sequence")
    np.testing.assert_allclose(result.masses, expected, rtol=0, atol=1e-12)
    assert result.cases_per_row.tolist() == [3] * 6
    assert [row["mass_cases"] for row in result.rows()] == [3] * 6
    # A link only reorders nothing: held-out Spearman is that of (mass, accuracy) over the held-out rows.
    stats = pytest.importorskip("scipy.stats")
    held = ~result.fitted
    assert result.scores["held out"]["spearman"] == pytest.approx(
        stats.spearmanr(expected[held], table.accuracy[held]).statistic, abs=1e-12)


def test_a_case_measured_twice_counts_once_per_measured_sequence(tmp_path):
    rows = _cases(lengths=(12,), per=2)
    cases = _write_cases(tmp_path / "cases.jsonl", rows)
    arrays = _fake_measurement(tmp_path / "m12", rows, 12, 3, order=[0, 0, 1, 2, 3, 4, 5])
    table = external.read_accuracy_table(_table(tmp_path / "table.csv", rows, lengths=(12,)))
    masses, counts = per_case.per_case_masses(table, {12: per_case.read_measured_cases(tmp_path / "m12", rows_of(
        cases))})
    np.testing.assert_allclose(masses, _oracle(rows, {12: arrays}, table, "sequence_rollout_per_sequence"),
                               rtol=0, atol=1e-12)
    assert counts.tolist() == [3, 2, 2]



def _argv(tmp_path, *extra):
    return ["compare-task", "--accuracy", tmp_path / "table.csv", "--measured", tmp_path / "m12", "--measured",
            tmp_path / "m16", "--per-case", tmp_path / "cases.jsonl", "--out", tmp_path / "out", *extra]


@pytest.fixture
def folders(tmp_path):
    rows = _cases()
    _write_cases(tmp_path / "cases.jsonl", rows)
    _fake_measurement(tmp_path / "m12", rows, 12, 1)
    _fake_measurement(tmp_path / "m16", rows, 16, 2)
    _table(tmp_path / "table.csv", rows)
    return rows


def _refused(tmp_path, capsys, argv, message):
    code, _, stderr = run_cli(argv, capsys)
    assert code == 2, stderr
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "out").exists()


def test_refusals_of_what_cannot_be_matched(tmp_path, capsys, folders):
    rows = folders
    _fake_measurement(tmp_path / "plain", rows, 12, 4, stats=("influence",))
    argv = _argv(tmp_path)
    _refused(tmp_path, capsys, [*argv[:3], "--measured", tmp_path / "plain", *argv[5:]],
             "no sequence_rollout_per_sequence in measurement.npz; allowed: a measurement with jaxroll measure "
             "--stats ...,sequence_rollout")
    _refused(tmp_path, capsys, [*argv[:5], *argv[7:]], "no folder measured at length 16")
    _refused(tmp_path, capsys, [*argv[:5], "--measured", tmp_path / "m12", *argv[7:]],
             "two folders measured at length 12")
    _write_cases(tmp_path / "fewer.jsonl", rows[1:])
    _refused(tmp_path, capsys, [*argv[:7], "--per-case", tmp_path / "fewer.jsonl", *argv[9:]],
             "measured sequence 0 (N = 12) is the prompt of no case")
    twice = rows + [{**rows[0], "sample": 7, "record_start": 2, "record_end": 4}]
    twice[-1].pop("depth", None), twice[-1].pop("record_length", None)
    _write_cases(tmp_path / "twice.jsonl", twice)
    _refused(tmp_path, capsys, [*argv[:7], "--per-case", tmp_path / "twice.jsonl", *argv[9:]],
             "is the prompt of cases with gold spans [(1, 4), (2, 4)]")
    text = (tmp_path / "table.csv").read_text() + "L=16,16,2,5,0.3,100\n"
    (tmp_path / "table.csv").write_text(text)
    _refused(tmp_path, capsys, argv, "line 8: no measured case at length 16 has the gold span [2, 5)")


@pytest.mark.parametrize("extra, message", [
    (["--per-case-rows", "influence", "--per-case", None], "--per-case-rows: given without --per-case"),
    (["--preset", "mpt-7b"], "--per-case: given with --preset"),
    (["--task", "kv"], "--per-case: given with --task"),
    (["--fit-settings", "L=99"], "--fit-settings: got 'L=99'"),
])
def test_flags_that_do_not_go_with_per_case_are_refused(tmp_path, capsys, folders, extra, message):
    argv = _argv(tmp_path, *extra)
    if None in extra:  # drop --per-case CASES: only --per-case-rows is left
        argv = [*argv[:7], *argv[9:-2]]
    _refused(tmp_path, capsys, argv, message)


def test_per_case_needs_accuracy_and_measured_and_readable_cases(tmp_path, capsys, folders):
    argv = _argv(tmp_path)
    _refused(tmp_path, capsys, [*argv[:3], *argv[7:]], "--per-case: needs --accuracy FILE and --measured DIR")
    (tmp_path / "bad.jsonl").write_text('{"prompt_ids": [2, 3]}\n')
    _refused(tmp_path, capsys, [*argv[:7], "--per-case", tmp_path / "bad.jsonl", *argv[9:]],
             f"--per-case {tmp_path / 'bad.jsonl'}: line 1: field 'answer_ids'")
    with pytest.raises(ConfigError, match="--per-case-rows: got 'attention'"):
        per_case.read_measured_cases(tmp_path / "m12", rows_of(tmp_path / "cases.jsonl"), rows="attention")


def test_compare_task_per_case_end_to_end_on_a_tiny_model(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=32, intermediate_size=64, vocab_size=VOCAB, bos_token_id=1,
                                      eos_token_id=1, pad_token_id=0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "llama")
    rows = _cases(per=2)
    _write_cases(tmp_path / "cases.jsonl", rows)
    table = external.read_accuracy_table(_table(tmp_path / "table.csv", rows))
    arrays = {}
    for length in (12, 16):
        prompts = _write_cases(tmp_path / f"prompts-{length}.jsonl",
                               [{"prompt_ids": r["prompt_ids"]} for r in rows if len(r["prompt_ids"]) == length])
        code, _, stderr = run_cli(["measure", tmp_path / "llama", "--texts", prompts, "--length", length, "--samples",
                                   6, "--dtype", "float64", "--stats", "lambda,influence,sequence_rollout", "--out",
                                   tmp_path / f"m{length}", "--quiet"], capsys)
        assert code == 0, stderr
        with np.load(tmp_path / f"m{length}" / "measurement.npz") as archive:
            arrays[length] = {key: archive[key] for key in archive.files}
        # Each own rollout row is a distribution: a product of row-stochastic (1 - lambda) I + lambda A.
        np.testing.assert_allclose(arrays[length]["sequence_rollout_per_sequence"].sum(1), 1.0, atol=1e-12)
    code, stdout, stderr = run_cli(_argv(tmp_path, "--fit-settings", "L=16", "--json"), capsys)
    assert code == 0, stderr
    summary = json.loads(stdout)
    expected = _oracle(rows, arrays, table, "sequence_rollout_per_sequence")
    np.testing.assert_allclose([row["mass"] for row in summary["rows"]], expected, rtol=0, atol=1e-12)
    assert [row["mass_cases"] for row in summary["rows"]] == [2] * 6
    assert summary["fit_settings"] == ["L=16"] and summary["held_settings"] == ["L=12"]
    assert "per-case sequence_rollout_per_sequence" in summary["source"]
    written = {path.name for path in (tmp_path / "out").iterdir()}
    assert written == {"compare.csv", "compare.json", "compare.txt", "compare.png"}
    header = (tmp_path / "out" / "compare.csv").read_text().splitlines()[0].split(",")
    assert "mass_cases" in header and "mass_se" in header
    statement = (tmp_path / "out" / "compare.txt").read_text().splitlines()
    assert any(line.startswith("Per case: 2 measured cases a row") for line in statement)


def _oracle_groups(rows, arrays_by_length, table, key):
    """Each table row's list of its measured cases' masses, summed position by position (as `_oracle`)."""
    groups = []
    for length, start, end in zip(table.lengths, table.starts, table.ends):
        arrays = arrays_by_length[int(length)]
        spans = {tuple(row["prompt_ids"]): _span(row) for row in rows if len(row["prompt_ids"]) == length}
        groups.append([sum(float(arrays[key][s, j]) for j in range(start, end))
                       for s, ids in enumerate(arrays["token_ids"].tolist()) if spans[tuple(ids)] == (start, end)])
    return groups


def test_each_per_case_mass_carries_its_standard_error(tmp_path):
    """``mass_se`` = sd(m_s) / sqrt(n) with the n - 1 denominator, written as a loop here (1e-12: a few sums)."""
    rows = _cases(per=4)
    cases = _write_cases(tmp_path / "cases.jsonl", rows)
    arrays = {length: _fake_measurement(tmp_path / f"m{length}", rows, length, seed)
              for length, seed in ((12, 5), (16, 6))}
    table = external.read_accuracy_table(_table(tmp_path / "table.csv", rows))
    result = per_case.compare_per_case(table, [tmp_path / "m12", tmp_path / "m16"], cases, resamples=20)
    expected = []
    for masses in _oracle_groups(rows, arrays, table, "sequence_rollout_per_sequence"):
        mean = sum(masses) / len(masses)
        expected.append((sum((m - mean) ** 2 for m in masses) / (len(masses) - 1) / len(masses)) ** 0.5)
    np.testing.assert_allclose(result.mass_standard_errors, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose([row["mass_se"] for row in result.rows()], expected, rtol=0, atol=1e-12)


def _two_cases_a_row(tmp_path):
    """The table of `_cases` with two measured cases a row, and its per-case comparison."""
    rows = _cases(per=2)
    cases = _write_cases(tmp_path / "cases.jsonl", rows)
    for length, seed in ((12, 1), (16, 2)):
        _fake_measurement(tmp_path / f"m{length}", rows, length, seed)
    table = external.read_accuracy_table(_table(tmp_path / "table.csv", rows))
    return table, per_case.compare_per_case(table, [tmp_path / "m12", tmp_path / "m16"], cases, resamples=20)


@pytest.mark.parametrize("error, says", [(0.2, "at least the median gap between neighbouring depths (0.15), so the "
                                               "ranking may be sampling: measure more prompts a row."),
                                         (0.1, "below the median gap between neighbouring depths (0.15)."),
                                         (np.nan, None)])
def test_the_statement_weighs_the_standard_errors_against_the_gaps_between_depths(tmp_path, error, says):
    """Masses chosen by hand: at N = 12 in depth order 0.1, 0.3, 0.2 (gaps 0.2, 0.1), at 16 0.1, 0.15, 0.4 (gaps
    0.05, 0.25): the median gap is 0.15."""
    import dataclasses

    _, result = _two_cases_a_row(tmp_path)
    result = dataclasses.replace(result, masses=np.array([0.1, 0.3, 0.2, 0.1, 0.15, 0.4]),
                                 mass_standard_errors=np.full(6, error))
    line = next(line for line in result.statement() if line.startswith("Per case:"))
    if says is None:
        assert line == ("Per case: one measured case a row, so the masses' sampling error is unknown; measure more "
                        "prompts a row.")
    else:
        assert line == (f"Per case: 2 measured cases a row; the masses' standard error (median {error:.2g}) is "
                        + says)


def test_with_one_row_a_setting_the_standard_errors_are_not_weighed_against_a_gap(tmp_path):
    """Every row its own setting: no neighbouring depths, so no gap (NaN) and no comparison with one."""
    import dataclasses

    table, result = _two_cases_a_row(tmp_path)
    alone = dataclasses.replace(table, settings=tuple(f"row {r}" for r in range(len(table.settings))))
    result = dataclasses.replace(result, table=alone, mass_standard_errors=np.full(len(table.settings), 0.1))
    line = next(line for line in result.statement() if line.startswith("Per case:"))
    assert line == ("Per case: 2 measured cases a row; the masses' standard error (median 0.1) has no neighbouring "
                    "depths to be weighed against (one row a setting).")


def test_the_extended_per_case_rows_of_validation_reduce_to_todays_and_match_a_matrix_product():
    """validation/task_extended_rows.py's five per-prompt layers, rolled out by `rollouts_per_sequence`, against the
    product of the layers formed here.

    Oracle: ``e_{N-1}^T R_T ... R_1`` as a NumPy float64 matrix product of the dense ``R_t`` built in this test
    (``R_t(i, :) = ((1 - l) e_i + l B(i, :)) / (1 - l + l sum_j B(i, j))`` with ``B = (1 - rho) K + rho C / sum_j C``,
    ``C = A sqrt(1 - 2A + sum_k A_k^2)`` per head, averaged over heads, and the first row's empty C left empty).
    ``norm``: each head's rows weighted by its value norms, renormalised, averaged over heads.
    1e-12: float64, a few products of 9 x 9 matrices. With no probability path (P = 0) the shape variants are
    today's rows; every row sums to 1.
    """
    torch = pytest.importorskip("torch")
    import validation_scripts

    from jaxroll.theory.sequence_mean import rollouts_per_sequence

    script = validation_scripts.load("task_extended_rows")
    rng = np.random.default_rng(3)
    layers, heads, n = 3, 2, 9
    causal = np.tril(np.ones((n, n)))
    alpha = [(lambda w: w / w.sum(-1, keepdims=True))(rng.uniform(0.1, 1, (heads, n, n)) * causal)
             for _ in range(layers)]
    x_norms = [rng.uniform(1, 2, n) for _ in range(layers)]
    a_norms = [rng.uniform(0, 2, n) for _ in range(layers)]
    paths = rng.uniform(0.5, 3, (4, layers))
    value_norms = [rng.uniform(0.5, 2, (heads, n)) for _ in range(layers)]
    state = {(kind, t): torch.as_tensor(values[t]) for t in range(layers)
             for kind, values in (("alpha", alpha), ("x", x_norms), ("a", a_norms), ("value_norms", value_norms))}

    def rows(paths):
        found = script.variant_layers(state, layers, paths)
        return {name: rollouts_per_sequence(lam[None], kernels[None], [n - 1])[0, 0]
                for name, (lam, kernels) in found.items()}

    def product(lambdas, branches):
        total = np.eye(n)
        for lam, branch in zip(lambdas, branches):
            layer = ((1 - lam) * np.eye(n) + lam * branch) / (1 - lam + lam * branch.sum(-1, keepdims=True))
            total = layer @ total
        return total[-1]

    means = [a.mean(0) for a in alpha]
    shapes = []
    for a in alpha:
        c = np.mean([a[h] * np.sqrt(1 - 2 * a[h] + (a[h] ** 2).sum(-1, keepdims=True)) for h in range(heads)], 0)
        sums = c.sum(-1, keepdims=True)
        assert sums[0, 0] == 0 and np.all(sums[1:] > 0)  # the first row has one key
        shapes.append(c / np.where(sums > 0, sums, 1.0))
    ratio = [np.mean(a / (x + a)) for x, a in zip(x_norms, a_norms)]
    share = (paths[1] + paths[2]) / paths[:3].sum(0)
    rho = paths[2] / (paths[1] + paths[2])
    mixed = [(1 - r) * k + r * c for r, k, c in zip(rho, means, shapes)]
    weighted = [np.mean([a[h] * v[h] / (a[h] * v[h]).sum(-1, keepdims=True) for h in range(heads)], 0)
                for a, v in zip(alpha, value_norms)]
    expected = {"base": product(ratio, means), "share": product(share, means), "shape": product(ratio, mixed),
                "both": product(share, mixed), "norm": product(ratio, weighted)}
    found = rows(paths)
    assert found.keys() == expected.keys()
    for name, row in expected.items():
        np.testing.assert_allclose(found[name], row, rtol=0, atol=1e-12, err_msg=name)
        assert abs(found[name].sum() - 1) < 1e-12
    for name in ("shape", "norm"):  # each moves the row: the test can fail
        assert np.abs(found[name] - found["base"]).max() > 1e-4, name
    no_path = paths.copy()
    no_path[2] = 0.0
    found = rows(no_path)
    np.testing.assert_allclose(found["shape"], found["base"], rtol=0, atol=1e-12)
