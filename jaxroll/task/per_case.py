"""Span masses per case: each measured case's own row summed over its own gold record, then averaged per table row.

``jaxroll compare-task --accuracy TABLE --measured DIR ... --per-case CASES``.
The rollout of a measurement's configuration is one profile per length, so
every case at a depth gets the same span mass (`jaxroll.task.external`).
A content-addressed lookup does not read one profile: each case attends to
its own record. Here each case keeps its own row. For a sequence s measured
at length N (its token ids are the prompt of one case of CASES, whose gold
record is ``[a_s, b_s)``) and its row ``r_s`` ``(N,)``:

- ``sequence_rollout`` (the prediction; ``jaxroll measure --stats
  ...,sequence_rollout``, `jaxroll.measure.sequence_rollout`): the last row
  of the rollout of its own attention and mixing (arXiv 2602.16837),

      R_t^s = (1 - lambda_t^s) I + lambda_t^s A_t^s,
      r_s   = e_{N-1}^T R_T^s ... R_1^s,

  with ``A_t^s`` the head-averaged attention of block t on sequence s and
  ``lambda_t^s`` its mixing ratio, both measured on that sequence alone;
- ``influence`` (the measured bound; ``influence_per_sequence``): its
  measured influence row, normalised gradient norms of the last position.

The mass of table row r (length ``L_r``, span ``[s_r, e_r)``) is the mean,
over the measured sequences at ``L_r`` whose gold span is exactly that span,
of their own mass over it:

    m_s = sum_{j = a_s}^{b_s - 1} r_s(j),
    x_r = mean_{s : N_s = L_r, [a_s, b_s) = [s_r, e_r)} m_s.

Then the same monotone link as for one profile per length, fitted on some
settings and tested on the others (`jaxroll.task.external.compare_accuracy_table`
with ``masses``).

Matching is by content: a measured sequence is the case whose ``prompt_ids``
equal its token ids (``jaxroll measure --texts`` takes a document's first N
ids, so a prompt of exactly N ids is measured whole). Everything that cannot
be matched is refused in one line before any output: a folder without the
rows, two folders at one length, a table length no folder measured, a
measured sequence that is no case's prompt (or the prompt of cases with
different gold spans), a table row without a measured case of its span.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["ROWS", "MeasuredCases", "read_measured_cases", "per_case_masses", "standard_errors", "compare_per_case"]

ROWS = {"sequence_rollout": "sequence_rollout_per_sequence", "influence": "influence_per_sequence"}
"""The per-sequence rows a span mass can come from: ``--per-case-rows`` name -> the array of measurement.npz."""
_STATS = {"sequence_rollout": "sequence_rollout", "influence": "influence"}
"""The ``jaxroll measure --stats`` entry that writes each kind of row (for the refusals)."""


@dataclasses.dataclass(frozen=True)
class MeasuredCases:
    """One measurement folder matched to its cases: ``rows (S, N)`` float64 and ``spans (S, 2)`` ``[start, end)``."""

    folder: str
    rows: np.ndarray
    spans: np.ndarray

    @property
    def length(self) -> int:
        """N, the measured length."""
        return int(self.rows.shape[1])

    def span_masses(self) -> np.ndarray:
        """``m_s = sum_{j=a_s}^{b_s-1} r_s(j)``: each sequence's own row over its own gold span, ``(S,)``."""
        return np.array([row[start:end].sum() for row, (start, end) in zip(self.rows, self.spans)])


def _gold_spans(cases, flag: str) -> dict:
    """``{prompt ids: {(start, end), ...}}`` over `cases` (`jaxroll.task.given.read_cases`'s `Case` objects)."""
    spans: dict = {}
    for case in cases:
        spans.setdefault(tuple(case.prompt_ids), set()).add((case.depth, case.depth + case.record_length))
    if not spans:
        raise ConfigError(f"{flag}: no cases; allowed: the cases whose prompts were measured")
    return spans


def read_measured_cases(folder, cases, *, rows: str = "sequence_rollout", flag: str = "--measured",
                        cases_flag: str = "--per-case") -> MeasuredCases:
    """The per-sequence `rows` of the measurement in `folder` and each sequence's gold span from `cases`.

    Args:
        folder: the ``--out`` of ``jaxroll measure`` (its ``measurement.npz``: ``token_ids (S, N)`` and the rows).
        cases: the cases whose prompts were measured (`jaxroll.task.given.read_cases`), any superset.
        rows: ``"sequence_rollout"`` (``sequence_rollout_per_sequence``, each sequence's own rollout) or
            ``"influence"`` (``influence_per_sequence``, its measured influence); `ROWS`.
        flag: the command line's name of the folder, for the refusals.
        cases_flag: the command line's name of the cases, for the refusals.

    Returns:
        A `MeasuredCases`: rows ``(S, N)``, spans ``(S, 2)`` in the measurement's sequence order.

    Raises:
        ConfigError: an unknown `rows`; a folder without ``measurement.npz`` or without the rows; rows that are not
            ``(S, N)`` like ``token_ids``, or not finite; a sequence that is no case's prompt, or the prompt of
            cases with different gold spans.
    """
    from ..measure.outputs import read_measurement  # NumPy only: no torch, no JAX

    if rows not in ROWS:
        raise ConfigError.of("--per-case-rows", rows, ", ".join(ROWS))
    label = f"{flag} {folder}"
    arrays = read_measurement(folder, flag=flag, need_metadata=False).arrays
    name = ROWS[rows]
    if name not in arrays or "token_ids" not in arrays:
        raise ConfigError(f"{label}: no {name if name not in arrays else 'token_ids'} in measurement.npz; allowed: "
                          f"a measurement with jaxroll measure --stats ...,{_STATS[rows]}",
                          field=label, value=str(folder), allowed=f"--stats ...,{_STATS[rows]}")
    values, ids = np.asarray(arrays[name], dtype=np.float64), np.asarray(arrays["token_ids"])
    if values.ndim != 2 or values.shape != ids.shape or not np.all(np.isfinite(values)):
        raise ConfigError(f"{label}: {name} of shape {values.shape} (finite: {bool(np.all(np.isfinite(values)))}) "
                          f"beside token_ids {ids.shape}; allowed: finite rows (S, N), one per measured sequence")
    spans = _gold_spans(cases, cases_flag)
    found = []
    for index, sequence in enumerate(ids.tolist()):
        gold = spans.get(tuple(sequence))
        if gold is None:
            raise ConfigError(f"{label}: measured sequence {index} (N = {ids.shape[1]}) is the prompt of no case in "
                              f"{cases_flag}; allowed: the cases whose prompts were measured, each prompt exactly "
                              "N ids")
        if len(gold) > 1:
            raise ConfigError(f"{label}: measured sequence {index} is the prompt of cases with gold spans "
                              f"{sorted(gold)} in {cases_flag}; allowed: one gold span per prompt")
        found.append(next(iter(gold)))
    return MeasuredCases(str(folder), values, np.array(found, dtype=np.int64).reshape(-1, 2))


def per_case_masses(table, measured) -> tuple[np.ndarray, np.ndarray]:
    """``(x, counts)``: each table row's mean of its measured cases' own span masses, and how many, ``(R,)`` each.

    ``x_r = mean_{s : N_s = L_r, [a_s, b_s) = [s_r, e_r)} sum_{j=s_r}^{e_r-1} r_s(j)`` (module docstring);
    `measured` maps each length of `table` (`jaxroll.task.external.AccuracyTable`) to its `MeasuredCases`.

    Raises:
        ConfigError: a length of the table with no measurement; a row no measured case has the span of.
    """
    return _means_and_counts(_row_masses(table, measured))


def _means_and_counts(groups) -> tuple[np.ndarray, np.ndarray]:
    return np.array([g.mean() for g in groups]), np.array([len(g) for g in groups], dtype=np.int64)


def standard_errors(groups) -> np.ndarray:
    """``(R,)``: the standard error of each row's mean mass, ``sd(m_s) / sqrt(n_r)`` (``ddof = 1``), NaN for one case;
    `groups` holds one array of the row's per-case masses ``m_s`` a row.

    The sampling error of ``x_r`` from measuring ``n_r`` of the row's cases: the per-case masses vary from prompt to
    prompt, so a few prompts a row can rank rows by noise (docs/task.md, "Every held-out case measured")."""
    return np.array([g.std(ddof=1) / np.sqrt(len(g)) if len(g) > 1 else np.nan for g in groups])


def _row_masses(table, measured) -> list[np.ndarray]:
    """Each table row's measured cases' own span masses ``m_s`` (one array a row), with `per_case_masses`' refusals."""
    groups = []
    own = {length: (cases.span_masses(), cases.spans) for length, cases in measured.items()}
    for length, start, end, line in zip(table.lengths, table.starts, table.ends, table.lines):
        if int(length) not in own:
            raise ConfigError(f"--measured: no folder measured at length {int(length)} (table line {int(line)}; "
                              f"measured: {', '.join(map(str, sorted(own)))}); allowed: one folder per length")
        values, spans = own[int(length)]
        mine = (spans[:, 0] == start) & (spans[:, 1] == end)
        if not mine.any():
            raise ConfigError(f"--accuracy {table.source} line {int(line)}: no measured case at length {int(length)} "
                              f"has the gold span [{int(start)}, {int(end)}); allowed: rows whose span is a measured "
                              "case's gold record")
        groups.append(values[mine])
    return groups


def compare_per_case(table, folders, cases, *, rows: str = "sequence_rollout", fit_settings=None,
                     resamples: int = 2000, seed: int = 0):
    """`table` against per-case span masses: `per_case_masses` through the link of `compare_accuracy_table`.

    Args:
        table: an `jaxroll.task.external.AccuracyTable`.
        folders: measurement folders, one per length of the table (``jaxroll measure`` ``--out``).
        cases: the cases whose prompts were measured: a path (``jaxroll task --cases`` format,
            `jaxroll.task.given.read_cases`) or a list of `Case`.
        rows: which per-sequence rows (`ROWS`).
        fit_settings: as `compare_accuracy_table`.
        resamples: as `compare_accuracy_table`.
        seed: as `compare_accuracy_table`.

    Returns:
        The `TableComparison`: its ``masses`` the ``x_r``, its ``cases_per_row`` ``(R,)`` the number of measured
        cases behind each, its ``mass_standard_errors`` ``(R,)`` their `standard_errors`.

    Raises:
        ConfigError: everything `read_measured_cases` and `per_case_masses` refuse; two folders at one length.
    """
    from .external import _count_range, compare_accuracy_table, split_settings

    split_settings(table, fit_settings)  # a bad --fit-settings is refused before the folders are read
    if not isinstance(cases, (list, tuple)):
        cases = _read_cases(cases)
    measured: dict = {}
    for folder in folders:
        found = read_measured_cases(folder, cases, rows=rows)
        if found.length in measured:
            raise ConfigError(f"--measured: two folders measured at length {found.length} "
                              f"({measured[found.length].folder}, {folder}); allowed: one folder per length")
        measured[found.length] = found
    groups = _row_masses(table, measured)
    masses, counts = _means_and_counts(groups)
    if not np.all(masses > 0):
        row = int(table.lines[np.argmin(masses)])
        raise ConfigError(f"--per-case-rows {rows}: the span mass of table line {row} is {masses.min():.3g}; "
                          "allowed: positive masses (the link is in ln mass)")
    source = (f"per-case {ROWS[rows]} of {', '.join(map(str, folders))} ({counts.sum()} cases, "
              f"{_count_range(counts)} per row)")
    result = compare_accuracy_table(table, None, fit_settings=fit_settings, resamples=resamples, seed=seed,
                                    source=source, masses=masses)
    return dataclasses.replace(result, cases_per_row=counts, mass_standard_errors=standard_errors(groups))


def _read_cases(path) -> list:
    """`jaxroll.task.given.read_cases` with its refusals under ``--per-case`` (they name ``--cases`` there)."""
    from .given import read_cases

    try:
        return read_cases(Path(path))
    except ConfigError as error:
        if error.field and error.field.startswith("--cases"):
            raise error.renamed("--per-case" + error.field[len("--cases"):]) from None
        raise
