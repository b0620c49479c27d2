"""An accuracy table from outside (published numbers, another harness) against the rollout's prediction.

``jaxroll compare-task --accuracy FILE.csv`` reads a table of accuracy by
depth (`read_accuracy_table`; format in docs/task.md, "Your own accuracy
table"): row r gives a context of ``L_r`` tokens, the gold record's span
``[s_r, e_r)`` (token indices, or depth fractions turned into tokens), the
accuracy ``y_r`` measured on ``n_r`` cases, optional floor ``f_r`` and
ceiling ``c_r`` (e.g. closed-book and oracle accuracy; default 0 and 1) and
a setting (e.g. the number of documents; default: the length).

The predicted quantity is the rollout's influence mass over the record's
span (arXiv 2602.16837; ``p`` the influence row of the last position at
length ``L_r``):

    x_r = sum_{j = s_r}^{e_r - 1} p_{L_r}(j).

The link from mass to accuracy is a logistic in log-mass with a slope held
>= 0, squeezed between floor and ceiling:

    y_hat_r = f_r + (c_r - f_r) sigmoid(a + b ln x_r),   b >= 0.

Why this link and not isotonic regression: it is monotone (non-decreasing)
and inside ``[f_r, c_r]`` by construction, it has two parameters (a table
has 5-20 depths per setting), and it extrapolates: a held-out setting
(another length, another number of documents) moves the masses outside
the fitted range, where an isotonic fit is flat and would give one value
to every held-out depth beyond it. It is fitted by maximum binomial
likelihood, weights ``n_r`` (Fisher scoring, `fit_link`), on the rows of the
named settings only, and tested on the others: Spearman's rank correlation
of ``(x_r, y_r)`` over the held-out rows (the link leaves ranks unchanged
when b > 0) with a parametric bootstrap interval (``y_r`` redrawn as
``Binomial(n_r, y_r) / n_r``, the prediction held fixed), and the
prediction's error in accuracy units, ``sqrt(sum n_r (y_r - y_hat_r)^2 /
sum n_r)``, beside that of a constant (the fitted rows' mean accuracy).

No prediction ranks a finite table perfectly: the table's own sampling
error caps Spearman. Its noise ceiling (`noise_ceiling`) is the Spearman a
predictor that knew each row's true accuracy would score against the
table. The true accuracies are estimated by shrinking the observed ones
towards their mean until their spread is the observed one less the
binomial noise (method of moments; ``ybar`` the mean of ``y_r``):

    p_r = ybar + s (y_r - ybar),
    s^2 = max(0, var(y) - mean_r y_r (1 - y_r) / (n_r - 1)) / var(y),

then ``E Spearman(p, Binomial(n_r, p_r) / n_r)`` over draws, with its 95 %
interval. A Spearman target above the ceiling asks for more cases a row,
not a better prediction.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from ..errors import ConfigError

__all__ = ["AccuracyTable", "Link", "TableComparison", "read_accuracy_table", "span_masses", "fit_link",
           "split_settings", "compare_accuracy_table", "spearman", "true_accuracies", "noise_ceiling",
           "wilson_interval", "write_table_comparison"]

LEVEL = 0.95
SPANS = (("start", "end"), ("start_fraction", "end_fraction"))
"""The two ways to give a span: token indices ``[start, end)``, or depth fractions of the context."""
COLUMNS = ("setting", "length", "start", "end", "start_fraction", "end_fraction", "accuracy", "n_cases", "floor",
           "ceiling")
"""Every column the reader knows; others are refused (a misspelt optional column would be silently dropped)."""


@dataclasses.dataclass(frozen=True)
class AccuracyTable:
    """An external accuracy table, checked: arrays ``(R,)`` over its rows, spans in tokens ``[start, end)``."""

    source: str
    settings: tuple
    lengths: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    accuracy: np.ndarray
    n_cases: np.ndarray
    floor: np.ndarray
    ceiling: np.ndarray
    lines: np.ndarray  # the file's line number of each row, for the messages

    def setting_names(self) -> list[str]:
        """The settings in the order they first appear in the file."""
        return list(dict.fromkeys(self.settings))


def _number(field, text, line, where, integer=False):
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{where} line {line}: {field} {text!r}; allowed: a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{where} line {line}: {field} {text}; allowed: a finite number (no NaN or inf)")
    if integer and value != int(value):
        raise ConfigError(f"{where} line {line}: {field} {text}; allowed: an integer")
    return int(value) if integer else value


def _header(fields, where):
    """The span's column pair, after checking the header names every required column and no unknown one."""
    if not fields:
        raise ConfigError(f"{where}: no header line; allowed: a CSV whose first line names its columns")
    unknown = [name for name in fields if name not in COLUMNS]
    if unknown:
        raise ConfigError(f"{where}: unknown column {unknown[0]!r}; allowed: {', '.join(COLUMNS)}")
    if len(set(fields)) != len(fields):
        raise ConfigError(f"{where}: a column named twice in {','.join(fields)}; allowed: each column once")
    pairs = [pair for pair in SPANS if set(pair) <= set(fields)]
    if len(pairs) != 1:
        raise ConfigError(f"{where}: {'both span forms' if pairs else 'no span'} in the columns "
                          f"{','.join(fields)}; allowed: start,end (tokens) or start_fraction,end_fraction")
    for name in ("accuracy", "n_cases"):
        if name not in fields:
            raise ConfigError(f"{where}: missing column {name!r}; allowed: columns {','.join(pairs[0])},"
                              "accuracy,n_cases and optionally setting,length,floor,ceiling")
    return pairs[0]


def _row(record, line, pair, length, where):
    """One row's values, checked; spans turned into tokens."""
    for name, text in record.items():
        if name is None or text is None or (text.strip() == "" and name != "setting"):
            raise ConfigError(f"{where} line {line}: {'an extra cell' if name is None else f'no {name}'}; "
                              "allowed: a value in every column of the header")
    if "length" in record:
        length = _number("length", record["length"], line, where, integer=True)
    if length is None or length < 1:
        raise ConfigError(f"{where} line {line}: length {length}; allowed: a length column or --length, >= 1")
    accuracy = _number("accuracy", record["accuracy"], line, where)
    if not 0 <= accuracy <= 1:
        raise ConfigError(f"{where} line {line}: accuracy {accuracy}; allowed: a number in [0, 1]")
    n = _number("n_cases", record["n_cases"], line, where, integer=True)
    if n < 1:
        raise ConfigError(f"{where} line {line}: n_cases {n}; allowed: an integer >= 1")
    floor = _number("floor", record.get("floor", "0"), line, where)
    ceiling = _number("ceiling", record.get("ceiling", "1"), line, where)
    if not 0 <= floor < ceiling <= 1:
        raise ConfigError(f"{where} line {line}: floor {floor}, ceiling {ceiling}; allowed: 0 <= floor < "
                          "ceiling <= 1")
    integer = pair[0] == "start"
    start, end = (_number(name, record[name], line, where, integer=integer) for name in pair)
    if start >= end:
        raise ConfigError(f"{where} line {line}: {pair[0]} {start} >= {pair[1]} {end}; allowed: start < end")
    limit = length if integer else 1
    if start < 0 or end > limit:
        raise ConfigError(f"{where} line {line}: span [{start}, {end}) outside the context; allowed: 0 <= "
                          f"{pair[0]} < {pair[1]} <= {limit}" + (f" (length {length})" if integer else ""))
    if not integer:  # every token the fraction interval touches: floor(f_s L) < ceil(f_e L)
        start, end = math.floor(start * length), math.ceil(end * length)
    setting = record.get("setting", "").strip() or f"L={length}"
    return setting, length, start, end, accuracy, n, floor, ceiling


def read_accuracy_table(path, *, length: int | None = None, where: str = "--accuracy") -> AccuracyTable:
    """The CSV at `path`, checked row by row (module docstring), as an `AccuracyTable`.

    Columns: ``start,end`` (token indices, the span ``[start, end)``) or
    ``start_fraction,end_fraction`` (fractions of the context, the span
    ``[floor(f_s L), ceil(f_e L))``), ``accuracy`` in [0, 1], ``n_cases`` >= 1;
    optional ``setting`` (a name; default ``L=<length>``), ``length`` (tokens;
    default `length`), ``floor`` and ``ceiling`` (default 0 and 1). Lines
    starting with ``#`` are comments (where the numbers come from).

    Raises:
        ConfigError: one line naming the file's line and column: a missing or
            unknown column, a value that is not a number or is NaN, accuracy
            outside [0, 1], start >= end, a span outside the context,
            n_cases < 1, floor >= ceiling, a row given twice (same setting,
            length and span), fewer than 2 rows.
    """
    where = f"{where} {path}"
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a spreadsheet's byte-order mark is no column name
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{where}: cannot read ({type(error).__name__}); allowed: a UTF-8 CSV file") from None
    numbered = [(number, line) for number, line in enumerate(text.splitlines(), 1)
                if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.DictReader([line for _, line in numbered])
    pair = _header([name.strip() for name in reader.fieldnames or []], where)
    reader.fieldnames = [name.strip() for name in reader.fieldnames]
    rows, seen = [], {}
    for (line, _), record in zip(numbered[1:], reader):
        row = _row(record, line, pair, length, where)
        key = row[:4]
        if key in seen:
            raise ConfigError(f"{where} line {line}: the row of line {seen[key]} again (setting {row[0]}, length "
                              f"{row[1]}, span [{row[2]}, {row[3]})); allowed: each span once per setting")
        seen[key] = line
        rows.append(row + (line,))
    if len(rows) < 2:
        raise ConfigError(f"{where}: {len(rows)} rows; allowed: at least 2 to fit a link")
    columns = list(zip(*rows))
    return AccuracyTable(str(path), tuple(columns[0]), *(np.array(c, dtype=np.int64) for c in columns[1:4]),
                         np.array(columns[4], dtype=np.float64), np.array(columns[5], dtype=np.int64),
                         np.array(columns[6], dtype=np.float64), np.array(columns[7], dtype=np.float64),
                         np.array(columns[8], dtype=np.int64))


def span_masses(table: AccuracyTable, profiles) -> np.ndarray:
    """``x_r = sum_{j=s_r}^{e_r-1} p_{L_r}(j)``: each row's influence mass over its span, ``(R,)`` float64.

    `profiles` maps each length of the table to its influence profile ``(L,)``.
    """
    masses = np.empty(len(table.starts))
    for r, (length, start, end) in enumerate(zip(table.lengths, table.starts, table.ends)):
        profile = np.asarray(profiles[int(length)], dtype=np.float64)
        if profile.shape != (length,):
            raise ConfigError(f"profile at length {length}: shape {profile.shape}; allowed: ({length},)")
        masses[r] = float(np.sum(profile[start:end]))
    return masses


@dataclasses.dataclass(frozen=True)
class Link:
    """``y = floor + (ceiling - floor) sigmoid(a + b ln x)``, b >= 0: a monotone map from span mass to accuracy."""

    a: float
    b: float

    def __call__(self, mass, floor=0.0, ceiling=1.0) -> np.ndarray:
        """The predicted accuracy at `mass` (any shape; floor and ceiling broadcast with it)."""
        eta = self.a + self.b * np.log(np.maximum(np.asarray(mass, dtype=np.float64), np.finfo(float).tiny))
        return floor + (np.asarray(ceiling) - floor) / (1.0 + np.exp(-eta))


def _log_likelihood(eta, y, n, floor, ceiling):
    pi = np.clip(floor + (ceiling - floor) / (1.0 + np.exp(-eta)), 1e-12, 1 - 1e-12)
    return float(np.sum(n * (y * np.log(pi) + (1 - y) * np.log(1 - pi))))


def _scoring(design, theta, y, n, floor, ceiling, steps=200):
    """Fisher scoring of the binomial likelihood in eta = design @ theta, with step halving."""
    for _ in range(steps):
        eta = design @ theta
        s = 1.0 / (1.0 + np.exp(-eta))
        pi = np.clip(floor + (ceiling - floor) * s, 1e-12, 1 - 1e-12)
        slope = (ceiling - floor) * s * (1 - s)  # d pi / d eta
        score = design.T @ (n * (y - pi) * slope / (pi * (1 - pi)))
        information = (design * (n * slope ** 2 / (pi * (1 - pi)))[:, None]).T @ design
        step = np.linalg.lstsq(information + 1e-12 * np.eye(len(theta)), score, rcond=None)[0]
        before = _log_likelihood(eta, y, n, floor, ceiling)
        for _ in range(40):
            if _log_likelihood(design @ (theta + step), y, n, floor, ceiling) >= before:
                break
            step = step / 2
        theta = theta + step
        if np.max(np.abs(step)) < 1e-12:
            break
    return theta


def fit_link(mass, accuracy, n_cases, floor=0.0, ceiling=1.0) -> Link:
    """The `Link` of maximum binomial likelihood ``sum_r n_r [y_r ln y_hat_r + (1 - y_r) ln(1 - y_hat_r)]``.

    Fisher scoring in ``(a, b)`` on ln x centred and scaled; when the
    unconstrained slope is negative (accuracy falls with mass) the fit is
    redone with b = 0 (the best monotone non-decreasing link is then flat).
    Inputs ``(R,)`` (floor and ceiling broadcast).
    """
    y, n = np.asarray(accuracy, dtype=np.float64), np.asarray(n_cases, dtype=np.float64)
    floor, ceiling = np.broadcast_to(floor, y.shape).astype(float), np.broadcast_to(ceiling, y.shape).astype(float)
    u = np.log(np.maximum(np.asarray(mass, dtype=np.float64), np.finfo(float).tiny))
    centre, spread = float(np.mean(u)), float(np.std(u))
    theta = np.zeros(1)
    if spread > 0:
        design = np.stack([np.ones_like(u), (u - centre) / spread], axis=1)
        theta = _scoring(design, np.zeros(2), y, n, floor, ceiling)
        if theta[1] > 0:
            return Link(float(theta[0] - theta[1] * centre / spread), float(theta[1] / spread))
    theta = _scoring(np.ones((len(u), 1)), theta[:1], y, n, floor, ceiling)
    return Link(float(theta[0]), 0.0)


def _ranks(x):
    """Ranks 1..R with ties averaged."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for value in np.unique(x):
        tied = x == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(x, y) -> float:
    """Spearman's rho: Pearson's correlation of the ranks (ties averaged); NaN when either is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    rx, ry = _ranks(x) - (len(x) + 1) / 2, _ranks(y) - (len(y) + 1) / 2
    return float(np.sum(rx * ry) / math.sqrt(np.sum(rx ** 2) * np.sum(ry ** 2)))


def true_accuracies(accuracy, n_cases) -> tuple[np.ndarray, float]:
    """The rows' true accuracies estimated by moments: ``(p, s)`` with ``p_r = ybar + s (y_r - ybar)``,

    ``s^2 = max(0, var(y) - mean_r y_r (1 - y_r) / (n_r - 1)) / var(y)`` (``var`` with ddof 1), since
    ``y_r (1 - y_r) / (n_r - 1)`` is unbiased for the binomial variance ``p_r (1 - p_r) / n_r``: the observed
    spread less the sampling noise. ``s = 0`` (every p the mean) when the spread is all noise."""
    y, n = np.asarray(accuracy, dtype=np.float64), np.asarray(n_cases, dtype=np.float64)
    spread = float(np.var(y, ddof=1)) if len(y) > 1 else 0.0
    if spread == 0:
        return y.copy(), 0.0
    noise = float(np.mean(y * (1 - y) / np.maximum(n - 1, 1)))
    shrink = math.sqrt(max(0.0, spread - noise) / spread)
    return np.clip(y.mean() + shrink * (y - y.mean()), 0.0, 1.0), shrink


def noise_ceiling(accuracy, n_cases, *, resamples: int = 2000, rng=None) -> dict:
    """The Spearman that a predictor knowing the true accuracies would score against a table like this one.

    ``E Spearman(p, Binomial(n_r, p_r) / n_r)`` over `resamples` draws, with ``p`` from `true_accuracies`
    (draws where either side is constant are left out), and the draws' 95 % interval.

    Returns:
        ``{"spearman_ceiling": mean, "spearman_ceiling_interval": [low, high], "true_spread": s}``; NaN where
        the estimated true accuracies are all equal (``s = 0``: nothing to rank).
    """
    rng = np.random.default_rng(rng)
    p, shrink = true_accuracies(accuracy, n_cases)
    n = np.asarray(n_cases, dtype=np.int64)
    rhos = np.array([spearman(p, draw / n) for draw in rng.binomial(n, p, size=(resamples, len(p)))])
    rhos = rhos[np.isfinite(rhos)]
    if shrink == 0 or not len(rhos):
        return {"spearman_ceiling": float("nan"), "spearman_ceiling_interval": [float("nan")] * 2,
                "true_spread": shrink}
    tail = (1 - LEVEL) / 2
    return {"spearman_ceiling": float(rhos.mean()),
            "spearman_ceiling_interval": [float(q) for q in np.quantile(rhos, [tail, 1 - tail])],
            "true_spread": shrink}


def wilson_interval(accuracy, n_cases, level: float = LEVEL):
    """Wilson's score interval of a binomial proportion: ``(low, high)``, arrays like `accuracy`."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + level / 2)
    y, n = np.asarray(accuracy, dtype=np.float64), np.asarray(n_cases, dtype=np.float64)
    centre = (y + z ** 2 / (2 * n)) / (1 + z ** 2 / n)
    half = z * np.sqrt(y * (1 - y) / n + z ** 2 / (4 * n ** 2)) / (1 + z ** 2 / n)
    return centre - half, centre + half


def split_settings(table: AccuracyTable, fit_settings=None) -> tuple[list[str], list[str]]:
    """``(fitted, held out)`` setting names: `fit_settings` (default: the file's first setting) and the rest.

    Raises:
        ConfigError: a name not in the table, or every setting named (nothing left to test on, while the
            table has more than one).
    """
    names = table.setting_names()
    if fit_settings is None:
        fit_settings = names[:1]
    fit_settings = [str(name).strip() for name in fit_settings]
    unknown = [name for name in fit_settings if name not in names]
    if unknown or not fit_settings:
        raise ConfigError(f"--fit-settings: got {','.join(fit_settings)!r}; allowed: names from the table's "
                          f"settings {','.join(names)}")
    held = [name for name in names if name not in fit_settings]
    if not held and len(names) > 1:
        raise ConfigError(f"--fit-settings: names every setting ({','.join(names)}); allowed: leave at least one "
                          "out to test the link on")
    return [name for name in names if name in fit_settings], held


@dataclasses.dataclass
class TableComparison:
    """An accuracy table against the rollout's span masses: per row ``(R,)`` arrays, and the tests."""

    table: AccuracyTable
    masses: np.ndarray
    predicted: np.ndarray
    low: np.ndarray
    high: np.ndarray
    fitted: np.ndarray  # bool: the row's setting is one the link was fitted on
    link: Link
    fit_settings: list
    held_settings: list
    scores: dict  # group ("fitted", "held out", or a setting) -> its statistics (`_scores`)
    source: str = ""
    cases_per_row: np.ndarray | None = None  # (R,) measured cases behind each per-case mass (jaxroll.task.per_case)
    mass_standard_errors: np.ndarray | None = None  # (R,) each per-case mass's standard error (per_case)

    def rows(self) -> list[dict]:
        """One dict per table row: setting, role, span, depth (the span's midpoint over L), measured and predicted."""
        t = self.table
        rows = [{"setting": s, "role": "fit" if f else "held out", "length": int(n), "start": int(a), "end": int(b),
                  "depth_fraction": float((a + b) / 2 / n), "accuracy": float(y), "low": float(lo), "high": float(hi),
                  "n_cases": int(k), "floor": float(fl), "ceiling": float(c), "mass": float(x),
                  "predicted": float(p)}
                 for s, f, n, a, b, y, lo, hi, k, fl, c, x, p in zip(
                     t.settings, self.fitted, t.lengths, t.starts, t.ends, t.accuracy, self.low, self.high,
                     t.n_cases, t.floor, t.ceiling, self.masses, self.predicted)]
        if self.cases_per_row is not None:  # per-case masses: how many measured cases each mass averages
            for row, count in zip(rows, self.cases_per_row):
                row["mass_cases"] = int(count)
        if self.mass_standard_errors is not None:
            for row, error in zip(rows, self.mass_standard_errors):
                row["mass_se"] = float(error)
        return rows

    def statement(self) -> list[str]:
        """What the comparison can and cannot conclude, in plain lines."""
        return table_conclusions(self)


def _scores(mass, y, n, predicted, baseline, resamples, rng) -> dict:
    """Spearman of (mass, y) with a parametric bootstrap interval, and errors in accuracy units."""
    boot = rng.binomial(n.astype(np.int64), y, size=(resamples, len(y))) / n
    rhos = np.array([spearman(mass, b) for b in boot])
    tail = (1 - LEVEL) / 2
    low, high = np.nanquantile(rhos, [tail, 1 - tail]) if np.isfinite(rhos).any() else (np.nan, np.nan)
    return {"rows": int(len(y)), "cases": int(n.sum()), "spearman": spearman(mass, y),
            "spearman_interval": [float(low), float(high)],
            "rmse": float(np.sqrt(np.sum(n * (y - predicted) ** 2) / n.sum())),
            "mae": float(np.sum(n * np.abs(y - predicted)) / n.sum()),
            "rmse_constant": float(np.sqrt(np.sum(n * (y - baseline) ** 2) / n.sum()))}


def compare_accuracy_table(table: AccuracyTable, profile_at, *, fit_settings=None, resamples: int = 2000,
                           seed: int = 0, source: str = "", masses=None) -> TableComparison:
    """`table` against the rollout: span masses, a `Link` fitted on `fit_settings`, tested on the other settings.

    Args:
        table: from `read_accuracy_table`.
        profile_at: ``length -> (length,)`` influence profile (e.g. ``lambda L: jaxroll.influence(model, L)``),
            called once per length of the table.
        fit_settings: the settings the link is fitted on (default: the file's first; `split_settings`).
        resamples: draws of the parametric bootstrap of Spearman's interval and of its noise ceiling.
        seed: its random seed.
        source: where the profiles came from, for the statement.
        masses: ``(R,)`` the rows' span masses given directly instead of `span_masses` of `profile_at`'s
            profiles (which may then be None): e.g. each row's mean over its cases of the measured
            per-sequence influence summed over the span, the bound on what one profile per length can rank.

    Returns:
        A `TableComparison`; ``scores`` holds ``"fitted"`` (in sample), ``"held out"`` (all held-out rows) and
        one entry per held-out setting: rows, cases, spearman and its interval, rmse, mae, rmse_constant
        (the error of predicting the fitted rows' mean accuracy everywhere) and `noise_ceiling`'s entries.
    """
    fit_names, held_names = split_settings(table, fit_settings)
    if masses is None:
        profiles = {int(length): np.asarray(profile_at(int(length)), dtype=np.float64)
                    for length in dict.fromkeys(table.lengths.tolist())}
        masses = span_masses(table, profiles)
    masses = np.asarray(masses, dtype=np.float64)
    if masses.shape != table.accuracy.shape or not np.all(masses > 0):
        raise ConfigError(f"masses: shape {masses.shape}; allowed: ({len(table.accuracy)},), positive")
    settings = np.array(table.settings, dtype=object)
    fitted = np.isin(settings, fit_names)
    y, n = table.accuracy, table.n_cases.astype(np.float64)
    link = fit_link(masses[fitted], y[fitted], n[fitted], table.floor[fitted], table.ceiling[fitted])
    predicted = link(masses, table.floor, table.ceiling)
    baseline = float(np.average(y[fitted], weights=n[fitted]))
    rng = np.random.default_rng(seed)
    groups = {"fitted": fitted}
    if held_names:
        groups["held out"] = ~fitted
        groups.update({name: settings == name for name in held_names} if len(held_names) > 1 else {})
    scores = {name: _scores(masses[rows], y[rows], n[rows], predicted[rows], baseline, resamples, rng)
              for name, rows in groups.items()}
    draws = np.random.default_rng([seed, 1])  # its own stream: the Spearman intervals stay as they were
    for name, rows in groups.items():
        scores[name].update(noise_ceiling(y[rows], n[rows], resamples=resamples, rng=draws))
    low, high = wilson_interval(y, n)
    return TableComparison(table, masses, predicted, low, high, fitted, link, fit_names, held_names, scores, source)


def _rho(score) -> str:
    low, high = score["spearman_interval"]
    return f"Spearman {score['spearman']:.2f} [{low:.2f}, {high:.2f}]" if np.isfinite(score["spearman"]) else \
        "Spearman n/a (a constant column)"


def _ceiling(score) -> str:
    low, high = score["spearman_ceiling_interval"]
    if not np.isfinite(score["spearman_ceiling"]):
        return "noise ceiling n/a (the accuracies' spread is within their sampling error: nothing to rank)"
    return (f"noise ceiling {score['spearman_ceiling']:.2f} [{low:.2f}, {high:.2f}] (the Spearman of a predictor "
            "that knew the true accuracies)")


def table_conclusions(result: TableComparison) -> list[str]:
    """Plain statements: the fit, the out-of-sample test, and what no number here can support."""
    fit, link = result.scores["fitted"], result.link
    lines = [f"{result.table.source}: {len(result.masses)} rows, settings {', '.join(result.table.setting_names())};"
             f" predicted span mass from {result.source or 'the rollout'}.",
             f"Link y = floor + (ceiling - floor) sigmoid({link.a:.3g} + {link.b:.3g} ln mass), fitted on "
             f"{', '.join(result.fit_settings)} ({fit['rows']} rows): in sample {_rho(fit)}, error "
             f"{fit['rmse']:.3f} (constant {fit['rmse_constant']:.3f})."]
    if link.b == 0:
        lines.append("The fitted slope is 0: on the fitted settings accuracy does not rise with the span mass, so "
                     "the link predicts one accuracy everywhere.")
    held = result.scores.get("held out")
    if held is None:
        lines.append("One setting only: nothing held out, so no out-of-sample test (give the table a setting "
                     "column with two or more settings).")
        return lines + [_CAUSE]
    for name in ["held out"] + [n for n in result.held_settings if n in result.scores]:
        score = result.scores[name]
        lines.append(f"Held out{'' if name == 'held out' else f' {name}'} ({score['rows']} rows): {_rho(score)}, "
                     f"error {score['rmse']:.3f} in accuracy (constant {score['rmse_constant']:.3f}); "
                     f"{_ceiling(score)}.")
    low = held["spearman_interval"][0]
    if not np.isfinite(held["spearman"]):
        lines.append("Cannot conclude: the held-out masses or accuracies are constant, there is nothing to rank.")
    elif low > 0:
        lines.append("Can conclude: out of sample, spans the rollout gives more mass are the ones answered more "
                     "often (the interval excludes 0).")
    else:
        lines.append("Cannot conclude an agreement out of sample: the interval includes 0 or lies below it.")
    if held["rmse"] >= held["rmse_constant"]:
        lines.append("The link predicts the held-out accuracies no better than a constant does.")
    return lines + _sampling(result) + [_CAUSE]


def _neighbour_gap(result: TableComparison) -> float:
    """The median, over settings and their rows in order of depth, of ``|x_{r+1} - x_r|`` (NaN with one row a
    setting): how far apart the masses of neighbouring depths are."""
    t, gaps = result.table, []
    for name in t.setting_names():
        rows = np.flatnonzero(np.asarray(t.settings) == name)
        in_depth_order = rows[np.argsort(t.starts[rows] / t.lengths[rows], kind="stable")]
        gaps += np.abs(np.diff(result.masses[in_depth_order])).tolist()
    return float(np.median(gaps)) if gaps else float("nan")


def _count_range(counts) -> str:
    """``"n"`` when every row has n measured cases, else ``"min-max"``."""
    low, high = int(np.min(counts)), int(np.max(counts))
    return f"{low}" if low == high else f"{low}-{high}"


def _sampling(result: TableComparison) -> list[str]:
    """Per-case masses only: whether their standard errors let the rows be ranked (`_neighbour_gap`)."""
    if result.mass_standard_errors is None:
        return []
    errors = result.mass_standard_errors[np.isfinite(result.mass_standard_errors)]
    spread = _count_range(result.cases_per_row)
    if not len(errors):
        return ["Per case: one measured case a row, so the masses' sampling error is unknown; measure more prompts "
                "a row."]
    error, gap = float(np.median(errors)), _neighbour_gap(result)
    if not np.isfinite(gap):
        return [f"Per case: {spread} measured cases a row; the masses' standard error (median {error:.2g}) has no "
                "neighbouring depths to be weighed against (one row a setting)."]
    if error >= gap:
        return [f"Per case: {spread} measured cases a row; the masses' standard error (median {error:.2g}) is at "
                f"least the median gap between neighbouring depths ({gap:.2g}), so the ranking may be sampling: "
                "measure more prompts a row."]
    return [f"Per case: {spread} measured cases a row; the masses' standard error (median {error:.2g}) is below the "
            f"median gap between neighbouring depths ({gap:.2g})."]


_CAUSE = ("Cannot conclude: that influence causes the accuracy. The rollout ranks positions; the table's accuracy also "
          "depends on the task, its distractors and the model's training, which the rollout does not model.")


def write_table_comparison(result: TableComparison, out, *, title: str = "") -> list[Path]:
    """compare.csv (`TableComparison.rows`), compare.json (link and scores), compare.txt, compare.png in `out`."""
    from ..plot import plot_accuracy_table

    out = Path(out)
    rows = result.rows()
    with open(out / "compare.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = summary_of(result)
    (out / "compare.json").write_text(json.dumps(summary, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    (out / "compare.txt").write_text("\n".join(result.statement()) + "\n", encoding="utf-8")
    plot_accuracy_table(out / "compare.png", result, level=LEVEL, title=title)
    return [out / name for name in ("compare.csv", "compare.json", "compare.txt", "compare.png")]


def summary_of(result: TableComparison) -> dict:
    """The comparison as plain values: source, link, settings, scores and rows."""
    return {"table": result.table.source, "source": result.source,
            "link": {"form": "floor + (ceiling - floor) sigmoid(a + b ln mass)", "a": result.link.a,
                     "b": result.link.b},
            "fit_settings": result.fit_settings, "held_settings": result.held_settings, "scores": result.scores,
            "rows": result.rows()}
