"""Every measured row of ``P_T`` against its prediction, and the power law by distance with a bootstrap interval.

Pure NumPy at import (no torch, no JAX): the theory functions it calls
(`jaxroll.theory.rows.normalised_rows`, `jaxroll.theory.baselines.by_distance`,
`jaxroll.theory.baselines.fit_power_law`) are imported where they are used.

**Rows** (`score_rows`). The theory (arXiv 2602.16837) predicts every row of
``P_T = R_T ... R_1``; ``jaxroll measure --queries K`` measures the gradient
influence ``g[s, k, j]`` of every input position j on query position ``q_k``
for each sequence s (``influence_rows_per_sequence (S, K, N)``). Under a
causal mask row ``q_k`` lives on positions ``0..q_k``, and there it is a
last-row profile of length ``q_k + 1``; so each row is scored exactly as the
last row is (`jaxroll.measure.uncertainty.score`) on

    p_k = P[k, :q_k + 1] / sum_j P[k, j],      g_k = g[:, k, :q_k + 1]   (S, q_k + 1),

giving per row ``W1_k = W1(p_k, m_k)`` (over ``q_k`` steps, i.e. ``/ q_k``),
the noise of its measured mean (the bootstrap median of ``W1(m*_k, m_k)
sqrt(S / (S - 1))``), ``ratio_k = W1_k / noise_k`` (about 1 for a perfect
prediction) and the one-sided p-value of H0_k "the sequences were drawn
around p_k". Every row uses the same seed, hence the same B resamples of the
S sequences: one bootstrap of the sequences, shared by the rows as the
sequences are.

Across rows, the K tests are corrected by Holm's step-down rule (`holm`):
with the p-values sorted ``p_(1) <= ... <= p_(K)``, reject ``H0_(1), ...,
H0_(i)`` for the largest i with ``p_(j) <= alpha / (K - j + 1)`` for every
``j <= i`` (stop at the first j that fails); equivalently the adjusted
``p~_(i) = max_{j <= i} min(1, (K - j + 1) p_(j))`` is at most alpha. It
controls the family-wise error rate at alpha under any dependence between
rows (they share sequences). A bootstrap p-value is at least ``1 / (B + 1)``,
so Holm can reject anything only when ``1 / (B + 1) <= alpha / K``, i.e.
``B >= K / alpha - 1`` (`RowScores.summary` says whether it can).

**By distance** (`distance_exponent`). Brändel et al. (arXiv 2606.29139)
reduce rows to a curve by distance ``r = i - j`` (`by_distance`: the mean or
median over query positions of the row-normalised influence, sources before
a left-edge ``buffer`` left out) and fit ``gamma + beta (r + 1)^(-p)`` on
``r >= 1``. `fit_power_law`'s interval treats the curve's points as
independent with a common residual variance; the points of a measured curve
share every sequence and the misfit of the power law is not noise, so that
interval is not the measurement's uncertainty (several times too narrow:
about 4x on the synthetic measurement of tests/test_row_scores.py).
Here the interval comes from the sequences: resample them with
replacement B times, form each resample's mean rows, curve and fit, and
take the ``(1 -+ level) / 2`` quantiles of the B exponents ``p*_b``
(percentile interval). A predicted ``(K, N)`` array has no sequences: its
interval is the fit's, and is labelled so.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from ..errors import ConfigError
from .uncertainty import resample_counts, score

__all__ = ["RowScores", "score_rows", "holm", "distance_exponent", "score_measured_rows", "rows_lines", "REFINED"]

ALPHA = 0.05
"""The family-wise error rate of the Holm correction in `score_rows`."""


def holm(p_values, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """Holm's step-down correction: ``(rejected (K,) bool, adjusted (K,) p-values)``, in the input's order.

    Sorted ``p_(1) <= ... <= p_(K)``: ``p~_(i) = max_{j <= i} min(1, (K - j + 1) p_(j))``;
    ``H0_(i)`` is rejected iff ``p~_(i) <= alpha``, which is the step-down rule
    "reject while ``p_(j) <= alpha / (K - j + 1)``, stop at the first failure".
    Family-wise error rate at most alpha under any dependence (Holm 1979).
    """
    p_values = np.asarray(p_values, dtype=np.float64)
    if p_values.ndim != 1 or not np.all((p_values >= 0) & (p_values <= 1)):
        raise ConfigError("p_values: allowed: a (K,) array of values in [0, 1]")
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha: got {alpha!r}; allowed: 0 < alpha < 1")
    order = np.argsort(p_values, kind="stable")
    factors = p_values.size - np.arange(p_values.size)
    adjusted = np.empty_like(p_values)
    adjusted[order] = np.maximum.accumulate(np.minimum(1.0, factors * p_values[order]))
    return adjusted <= alpha, adjusted


def _frozen(values, dtype=np.float64) -> np.ndarray:
    array = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array


@dataclasses.dataclass(frozen=True, eq=False)
class RowScores:
    """The result of `score_rows`: one entry per measured row k (query position ``queries[k]``).

    ``w1 (K,)``: ``W1(p_k, m_k)`` on positions ``0..q_k`` (divided by
    ``q_k``); ``w1_interval (K, 2)``; ``noise (K,)``: the bootstrap median of
    ``W1(m*_k, m_k)``; ``ratio = w1 / noise`` and ``ratio_interval``;
    ``p_value (K,)``: H0_k "the sequences were drawn around p_k";
    ``holm_adjusted`` and ``holm_rejected`` at ``alpha`` (module docstring);
    ``n_eff (K,)``: Kish's effective number of sequences of each row.
    ``scores`` holds each row's full `jaxroll.measure.uncertainty.Score`.
    """

    queries: np.ndarray
    w1: np.ndarray
    w1_interval: np.ndarray
    noise: np.ndarray
    ratio: np.ndarray
    ratio_interval: np.ndarray
    p_value: np.ndarray
    holm_adjusted: np.ndarray
    holm_rejected: np.ndarray
    n_eff: np.ndarray
    sequences: int
    level: float
    resamples: int
    seed: int
    alpha: float
    scores: tuple = dataclasses.field(repr=False)

    def summary(self) -> dict:
        """Mean, median and max of W1/noise over rows (and the row of the max), Holm's count of rejections."""
        worst = int(np.argmax(self.ratio))
        smallest = 1.0 / (self.resamples + 1)
        return {"rows": int(self.queries.size), "ratio_mean": float(np.mean(self.ratio)),
                "ratio_median": float(np.median(self.ratio)), "ratio_max": float(self.ratio[worst]),
                "ratio_max_query": int(self.queries[worst]), "holm_rejected": int(np.sum(self.holm_rejected)),
                "alpha": self.alpha, "smallest_p_value": smallest,
                "holm_can_reject": bool(smallest <= self.alpha / self.queries.size),
                "sequences": self.sequences, "resamples": self.resamples, "seed": self.seed, "level": self.level}

    def as_dict(self) -> dict:
        """JSON-ready: ``{"rows": [per-row dicts], "summary": summary()}``."""
        rows = [{"query": int(q), "w1": float(w1), "w1_interval": [float(v) for v in w1_interval],
                 "noise": float(noise), "ratio": float(ratio), "ratio_interval": [float(v) for v in ratio_interval],
                 "p_value": float(p), "holm_adjusted": float(adjusted), "holm_rejected": bool(rejected),
                 "n_eff": float(n_eff)}
                for q, w1, w1_interval, noise, ratio, ratio_interval, p, adjusted, rejected, n_eff in zip(
                    self.queries, self.w1, self.w1_interval, self.noise, self.ratio, self.ratio_interval,
                    self.p_value, self.holm_adjusted, self.holm_rejected, self.n_eff)]
        return {"rows": rows, "summary": self.summary()}


def _check_settings(B, level) -> None:
    if isinstance(B, bool) or not isinstance(B, (int, np.integer)) or B < 2:
        raise ConfigError(f"B: got {B!r}; allowed: an integer >= 2")
    if not 0 < level < 1:
        raise ConfigError(f"level: got {level!r}; allowed: 0 < level < 1")


def _check_measured(rows_per_sequence) -> np.ndarray:
    rows = np.asarray(rows_per_sequence, dtype=np.float64)
    if rows.ndim != 3 or rows.shape[0] < 2 or rows.shape[1] < 1 or rows.shape[2] < 1:
        raise ConfigError(f"rows_per_sequence: got shape {rows.shape}; allowed: (S, K, N) with S >= 2")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise ConfigError("rows_per_sequence: a value is NaN, infinite or negative; allowed: gradient norms >= 0")
    return rows


def _check_queries(queries, count: int, length: int) -> np.ndarray:
    positions = np.asarray(queries)
    if positions.shape != (count,) or not np.issubdtype(positions.dtype, np.integer):
        raise ConfigError(f"queries: got shape {positions.shape} ({positions.dtype}); allowed: ({count},) integer "
                          "positions, one per row")
    bad = positions[(positions < 0) | (positions >= length)]
    if bad.size:
        raise ConfigError(f"queries: position {int(bad[0])}; allowed: positions in [0, {length - 1}] (N = {length})")
    return positions.astype(np.int64)


def _check_predicted(predicted, name: str = "predicted") -> np.ndarray:
    predicted = np.asarray(predicted, dtype=np.float64)
    if predicted.ndim != 2 or predicted.shape[0] < 1:
        raise ConfigError(f"{name}: got shape {predicted.shape}; allowed: (K, N) rows")
    if not np.all(np.isfinite(predicted)) or np.any(predicted < 0):
        raise ConfigError(f"{name}: a value is NaN, infinite or negative; allowed: probabilities >= 0")
    sums = predicted.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1) > 1e-6)
    if bad.size:
        raise ConfigError(f"{name}: row {int(bad[0])} sums to {sums[bad[0]]:.9g}; allowed: rows that sum to 1")
    return predicted


def score_rows(predicted, rows_per_sequence, queries, *, B: int = 1000, seed: int = 0,
               level: float = 0.95) -> RowScores:
    """Score every predicted row against the measured rows, each as the last row is, Holm-corrected across rows.

    For row k on positions ``0..q_k``: ``p_k = P[k, :q_k+1] / sum(P[k, :q_k+1])``
    against the per-sequence norms ``g[:, k, :q_k+1]`` by
    `jaxroll.measure.uncertainty.score` (same B, seed and level for every
    row, so every row sees the same resamples of the sequences): ``W1_k``,
    ``noise_k = median_b W1(m*_k, m_k) sqrt(S / (S - 1))``, ``ratio_k =
    W1_k / noise_k``, ``p_k = (1 + #{b: noise_kb >= W1_k}) / (B + 1)``. Then
    Holm's step-down rule at alpha = 0.05 across the K rows (`holm`; module
    docstring).

    Args:
        predicted: ``(K, N)`` predicted rows, each non-negative and summing to
            1 (`jaxroll.theory.rows.predicted_rows`).
        rows_per_sequence: ``(S, K, N)`` measured gradient norms, S >= 2
            (``influence_rows_per_sequence`` of ``measurement.npz``).
        queries: ``(K,)`` integer query positions in ``[0, N)``
            (``query_positions``).
        B: bootstrap resamples of the sequences (Holm can reject only with
            ``B >= K / 0.05 - 1``).
        seed: seed of ``numpy.random.default_rng``, the same for every row.
        level: the intervals' coverage.

    Returns:
        A `RowScores`.

    Raises:
        ConfigError: one line, for shapes that do not match, NaN or negative
            values, predicted rows that do not sum to 1 (or have no mass on
            ``0..q_k``), queries outside ``[0, N)``, a row measured with fewer
            than 2 sequences of gradient mass, B < 2 or level outside (0, 1).
    """
    predicted = _check_predicted(predicted)
    rows = _check_measured(rows_per_sequence)
    if rows.shape[1:] != predicted.shape:
        raise ConfigError(f"rows_per_sequence: got shape {rows.shape}; allowed: (S, {predicted.shape[0]}, "
                          f"{predicted.shape[1]}) like predicted {predicted.shape}")
    positions = _check_queries(queries, predicted.shape[0], predicted.shape[1])
    _check_settings(B, level)
    scores = []
    for k, q in enumerate(positions):
        head = predicted[k, : q + 1]
        if head.sum() <= 0:
            raise ConfigError(f"predicted: row {k} (query {q}) has no mass on positions 0..{q}; allowed: rows of a "
                              "causal rollout")
        measured = rows[:, k, : q + 1]
        if np.count_nonzero(measured.sum(axis=1) > 0) < 2:
            raise ConfigError(f"rows_per_sequence: row {k} (query {q}) has fewer than 2 sequences with gradient "
                              "mass on its positions; allowed: at least 2")
        scores.append(score(head / head.sum(), measured, B=int(B), seed=seed, level=level))
    p_values = np.array([s.p_value for s in scores])
    rejected, adjusted = holm(p_values, ALPHA)
    return RowScores(
        queries=_frozen(positions, np.int64), w1=_frozen([s.w1 for s in scores]),
        w1_interval=_frozen([s.w1_interval for s in scores]), noise=_frozen([s.noise for s in scores]),
        ratio=_frozen([s.ratio for s in scores]), ratio_interval=_frozen([s.ratio_interval for s in scores]),
        p_value=_frozen(p_values), holm_adjusted=_frozen(adjusted), holm_rejected=_frozen(rejected, bool),
        n_eff=_frozen([s.n_eff for s in scores]), sequences=int(rows.shape[0]), level=float(level),
        resamples=int(B), seed=int(seed), alpha=ALPHA, scores=tuple(scores))


P_BOUNDS = (1e-3, 10.0)
"""The range searched for the exponent p, as `jaxroll.theory.baselines.fit_power_law`'s default."""


def _profiled_rss(r1: np.ndarray, curves: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``(B,)`` residual sums of squares of each curve ``(B, n)`` at its own exponent ``p (B,)``, with
    (gamma, beta) solved by least squares at that p (variable projection)."""
    x = r1[None, :] ** (-p[:, None])
    n = r1.size
    b, c = x.sum(axis=1), (x * x).sum(axis=1)
    d1, d2 = curves.sum(axis=1), (x * curves).sum(axis=1)
    det = n * c - b * b
    gamma, beta = (c * d1 - b * d2) / det, (n * d2 - b * d1) / det
    return ((curves - gamma[:, None] - beta[:, None] * x) ** 2).sum(axis=1)


def _fit_exponents(r1: np.ndarray, curves: np.ndarray, p_bounds=P_BOUNDS, grid_size: int = 200) -> np.ndarray:
    """The least-squares exponent p of ``gamma + beta (r + 1)^(-p)`` for each curve ``(B, n)``, vectorised.

    As `fit_power_law` starts: the best of `grid_size` geometric grid points
    (RSS from the normal equations, ``y.y - theta.X'y``, all curves and grid
    points at once); then golden-section search on the profiled RSS between
    the grid point's neighbours, 80 steps (the bracket shrinks by 0.618 a step).
    """
    grid = np.geomspace(*p_bounds, grid_size)
    x = r1[None, :] ** (-grid[:, None])                               # (G, n)
    n = r1.size
    b, c = x.sum(axis=1), (x * x).sum(axis=1)                         # (G,)
    d1, d2 = curves.sum(axis=1), curves @ x.T                         # (B,), (B, G)
    det = n * c - b * b
    gamma = (c[None, :] * d1[:, None] - b[None, :] * d2) / det
    beta = (n * d2 - b[None, :] * d1[:, None]) / det
    rss = (curves * curves).sum(axis=1)[:, None] - gamma * d1[:, None] - beta * d2
    best = np.argmin(rss, axis=1)
    low, high = grid[np.maximum(best - 1, 0)], grid[np.minimum(best + 1, grid_size - 1)]
    ratio = (np.sqrt(5.0) - 1) / 2
    for _ in range(80):
        left, right = high - ratio * (high - low), low + ratio * (high - low)
        go_left = _profiled_rss(r1, curves, left) < _profiled_rss(r1, curves, right)  # minimum in [low, right]
        low, high = np.where(go_left, low, left), np.where(go_left, right, high)
    return (low + high) / 2


def _distance_curves(means: np.ndarray, queries: np.ndarray, statistic: str, buffer: int) -> np.ndarray:
    """`by_distance` of each ``(K, N)`` in ``means (B, K, N)`` at once: ``(B, max(q) - buffer + 1)``."""
    distances = np.arange(int(queries.max()) - buffer + 1)
    sources = queries[:, None] - distances[None, :]                   # (K, D)
    valid = sources >= buffer
    values = means[:, np.arange(queries.size)[:, None], np.where(valid, sources, 0)]  # (B, K, D)
    if statistic == "mean":
        return np.where(valid, values, 0.0).sum(axis=1) / valid.sum(axis=0)
    with warnings.catch_warnings():  # an all-NaN slice (a resample without mass in a row) stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(np.where(valid, values, np.nan), axis=1)


def distance_exponent(rows_per_sequence, queries, *, B: int = 1000, seed: int = 0, level: float = 0.95,
                      buffer: int = 0, statistic: str = "median") -> dict:
    """The exponent p of ``gamma + beta (r + 1)^(-p)`` fitted to the by-distance curve, with an interval.

    Measured ``(S, K, N)`` norms: the curve is ``by_distance(normalised_rows(g),
    queries, statistic, buffer=buffer)`` on ``r >= 1``, fitted by
    `fit_power_law`; the interval is the percentile bootstrap over
    sequences: for ``b = 1..B`` draw counts ``c_b ~ Multinomial(S, 1/S)``
    (`resample_counts`, ``numpy.random.default_rng(seed)``: the draws
    `score_rows` makes with the same seed), form ``m*_b[k] = sum_s c_bs g[s, k]
    / sum_{s, j} c_bs g[s, k, j]``, its curve and its least-squares exponent
    ``p*_b``, and report the ``(1 -+ level) / 2`` quantiles of the ``p*_b``.
    The B refits are vectorised (grid start and golden-section search on the
    profiled residual, all resamples at once): 1-2 s for B = 1000 at K = 8, N = 128 on 2 CPU cores.

    Predicted ``(K, N)`` rows (each summing to 1): no sequences, no
    bootstrap; the interval is `fit_power_law`'s own (Student t on the
    linearised covariance), and ``interval_kind`` says so.

    Args:
        rows_per_sequence: measured ``(S, K, N)`` gradient norms, or predicted
            ``(K, N)`` rows.
        queries: ``(K,)`` query positions.
        B: bootstrap resamples (measured only).
        seed: seed of ``numpy.random.default_rng`` (measured only).
        level: the interval's coverage.
        buffer: source positions ``j < buffer`` are left out of the curve
            (`by_distance`'s left-edge buffer).
        statistic: ``"median"`` or ``"mean"`` over query positions.

    Returns:
        A JSON-ready dict: ``p``, ``gamma``, ``beta``, ``p_interval`` [low,
        high], ``interval_kind`` (``"bootstrap"`` or ``"fit"``),
        ``fit_p_interval`` (`fit_power_law`'s, for comparison), ``at_bound``,
        ``draws_at_bound`` (resampled fits that ended at an end of
        ``P_BOUNDS``), ``draws_without_curve`` (resamples that drew no
        sequence with mass in some row: left out), ``distances`` and ``curve`` (r >= 1), ``statistic``,
        ``buffer``, ``level``, ``resamples``, ``seed``, ``sequences`` (None
        for predicted rows) and ``note`` (one sentence on the interval).
    """
    from ..theory.baselines import by_distance, fit_power_law
    from ..theory.rows import normalised_rows

    given = np.asarray(rows_per_sequence, dtype=np.float64)
    measured = given.ndim == 3
    if measured:
        rows = _check_measured(given)
        means = normalised_rows(rows)
    elif given.ndim == 2:
        means = _check_predicted(given, "rows")
    else:
        raise ConfigError(f"rows: got shape {given.shape}; allowed: measured (S, K, N) or predicted (K, N)")
    positions = _check_queries(queries, means.shape[0], means.shape[1])
    _check_settings(B, level)
    if statistic not in ("mean", "median"):
        raise ConfigError(f"statistic: got {statistic!r}; allowed: 'mean' or 'median'")
    distances, curve = by_distance(means, positions, statistic, buffer=buffer)
    if distances.size < 5:
        raise ConfigError(f"queries, buffer: the curve reaches r = {int(distances[-1])}; allowed: at least "
                          "4 distances r >= 1 (max(queries) - buffer >= 4)")
    fit = fit_power_law(distances[1:], curve[1:], level=level, p_bounds=P_BOUNDS)
    result = {"p": fit.p, "gamma": fit.gamma, "beta": fit.beta, "fit_p_interval": [float(v) for v in fit.interval[2]],
              "at_bound": fit.at_bound, "distances": distances[1:].tolist(), "curve": curve[1:].tolist(),
              "statistic": statistic, "buffer": int(buffer), "level": float(level)}
    if not measured:
        return {**result, "p_interval": result["fit_p_interval"], "interval_kind": "fit", "draws_at_bound": None,
                "draws_without_curve": None, "resamples": None, "seed": None, "sequences": None,
                "note": "predicted rows have no sequences to resample: the interval is the least-squares fit's "
                        "(Student t on the linearised covariance), not an uncertainty of the rows"}
    sequences = rows.shape[0]
    counts = resample_counts(sequences, int(B), np.random.default_rng(seed))
    flat = rows.reshape(sequences, -1)
    r1 = distances[1:].astype(np.float64) + 1.0
    draws = []
    for block in range(0, int(B), 64):  # (64, K, N) resampled rows at a time
        resampled = (counts[block: block + 64] @ flat).reshape(-1, *means.shape)
        with np.errstate(invalid="ignore", divide="ignore"):
            resampled /= resampled.sum(axis=-1, keepdims=True)
        curves = _distance_curves(resampled, positions, statistic, int(buffer))[:, 1:]
        # A resample that drew only sequences without mass in some row has no curve: it gets no exponent.
        usable = np.all(np.isfinite(curves), axis=1)
        exponents = np.full(usable.size, np.nan)
        exponents[usable] = _fit_exponents(r1, curves[usable]) if usable.any() else []
        draws.append(exponents)
    draws = np.concatenate(draws)
    fitted = draws[np.isfinite(draws)]
    if fitted.size < 2:
        raise ConfigError("rows_per_sequence: fewer than 2 resamples give a curve by distance; allowed: rows "
                          "with gradient mass in most sequences")
    low, high = np.quantile(fitted, [(1 - level) / 2, (1 + level) / 2])
    at_bound = np.isclose(fitted, P_BOUNDS[0], rtol=1e-6) | np.isclose(fitted, P_BOUNDS[1], rtol=1e-6)
    return {**result, "p_interval": [float(low), float(high)], "interval_kind": "bootstrap",
            "draws_at_bound": int(np.sum(at_bound)), "draws_without_curve": int(draws.size - fitted.size),
            "resamples": int(B), "seed": int(seed), "sequences": int(sequences),
            "note": f"percentile interval of the exponent over {fitted.size} resamples of the {sequences} sequences"}


REFINED = "refined"
"""``--rows-config refined``: score the refined rollout's rows that ``jaxroll measure --refine S --queries K``
wrote into the same measurement.npz (``refined_rows``), not the rows of a configuration."""


def _refined_rows(saved, label, rows_shape) -> tuple[np.ndarray, str]:
    """``refined_rows (K, N)`` beside the measured rows, and a name for it (the switches in metadata.json)."""
    refined = saved.arrays.get("refined_rows")
    if refined is None:
        raise ConfigError(f"{label}: no refined_rows in measurement.npz; allowed with --rows-config "
                          f"{REFINED}: a measurement made with jaxroll measure --refine SWITCHES --queries K")
    if refined.shape != rows_shape[1:]:
        raise ConfigError(f"{label}: refined_rows {refined.shape}; allowed: {rows_shape[1:]}, one per "
                          "measured row")
    try:
        switches = saved.metadata["refined"]["switches"]
    except (KeyError, TypeError):
        switches = None
    return refined, "the refined rollout" + (f" ({','.join(switches)})" if switches else "")


def _predicted_rows(saved, label, rows_config, rows, queries) -> tuple[np.ndarray, str]:
    """The rows ``P_T[q_k, :]`` that `rows_config` predicts at the measurement's N (float64), and its name."""
    from pathlib import Path

    if str(rows_config) == REFINED and not Path(rows_config).is_file():
        return _refined_rows(saved, label, rows.shape)
    import jax

    from .. import io
    from ..theory.rows import predicted_rows

    model = io.load_config(rows_config)
    with jax.enable_x64(True):
        return predicted_rows(model, queries.tolist(), n=rows.shape[2]), str(rows_config)


def score_measured_rows(saved, directory, label: str, rows_config, outputs, *, B: int = 1000, seed: int = 0,
                        level: float = 0.95,
                        buffer: int = 0, statistic: str = "median"):
    """Every measured row of `saved` (a `jaxroll.measure.outputs.SavedMeasurement` with ``--queries`` rows)
    against the rows of `rows_config` (a rollout YAML, or `REFINED`); writes rows.json and rows.png.

    `directory` is the measurement's folder, `label` how refusals name it
    (``--measured DIR``).
    `score_rows` (W1/noise, p-values, Holm) and `distance_exponent` for the
    measured rows (bootstrap interval over the sequences) and the predicted
    ones (the fit's interval). `outputs` is the pair of paths (rows.json,
    rows.png); the folder is created. Returns ``(record, scores, distance)``:
    the rows.json object, the `RowScores` and the two fitted exponents.
    """
    import json

    from ..plot.rows import plot_rows

    rows, queries, _ = saved.query_rows(label)
    predicted, name = _predicted_rows(saved, label, rows_config, rows, queries)
    settings = {"B": B, "seed": seed, "level": level}
    try:
        scores = score_rows(predicted, rows, queries, **settings)
        distance = {"measured": distance_exponent(rows, queries, **settings, buffer=buffer, statistic=statistic),
                    "predicted": distance_exponent(predicted, queries, **settings, buffer=buffer,
                                                   statistic=statistic)}
    except ConfigError as error:
        raise ConfigError(f"{label}, --rows-config {rows_config}: {error}") from None
    record = {**scores.as_dict(), "distance": distance, "measured": str(directory), "rows_config": str(rows_config)}
    outputs[0].parent.mkdir(parents=True, exist_ok=True)
    outputs[0].write_text(json.dumps(record, indent=1))
    plot_rows(scores, distance["measured"], distance["predicted"], outputs[1],
              title=f"rows of {directory} (S = {rows.shape[0]}, N = {rows.shape[2]}) against the rollout of {name}")
    return record, scores, distance


def rows_lines(scores: RowScores, distance: dict, outputs) -> list[str]:
    """The per-row table (query, W1/noise, p, Holm), the summary line and the two exponents, as text lines."""
    summary = scores.summary()
    lines = [f"every row: {summary['rows']} query positions, S = {summary['sequences']}, {summary['resamples']} "
             f"resamples (seed {summary['seed']}); H0 per row: the sequences were drawn around the predicted row",
             f"  {'query':>6} {'W1/noise':>9} {'p':>9} {'Holm p':>9}  rejected at {summary['alpha']:g} (Holm)"]
    for query, ratio, p_value, adjusted, rejected in zip(scores.queries, scores.ratio, scores.p_value,
                                                         scores.holm_adjusted, scores.holm_rejected):
        lines.append(f"  {int(query):6d} {ratio:9.3g} {p_value:9.3g} {adjusted:9.3g}  {'yes' if rejected else 'no'}")
    lines.append(
        f"  W1/noise over rows: mean {summary['ratio_mean']:.3g}, median {summary['ratio_median']:.3g}, max "
        f"{summary['ratio_max']:.3g} (query {summary['ratio_max_query']}); Holm rejects {summary['holm_rejected']} "
        f"of {summary['rows']} rows at {summary['alpha']:g}"
        + ("" if summary["holm_can_reject"] else
           f" (it cannot reject any: p >= 1/(B + 1) = {summary['smallest_p_value']:.3g} > alpha / K; "
           "raise --resamples)"))
    for name, fitted in distance.items():
        low, high = fitted["p_interval"]
        kind = "bootstrap over sequences" if fitted["interval_kind"] == "bootstrap" else "the fit's interval"
        lines.append(f"  by distance, {name}: p = {fitted['p']:.3g} [{low:.3g}, {high:.3g}] "
                     f"({100 * fitted['level']:g}%, {kind})"
                     + (" at a bound of the search" if fitted["at_bound"] else ""))
    lines.append(f"  wrote {outputs[0]} and {outputs[1]}")
    return lines
