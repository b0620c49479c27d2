"""How far a predicted profile is from a measurement, with uncertainty over sequences.

Pure NumPy (imports without torch or JAX). A measurement of S sequences
gives per-sequence gradient norms ``g_s (N,)`` (``influence_per_sequence``
in ``measurement.npz``); the measured profile is the normalised mean

    m = (1/S) sum_s g_s / sum_j (1/S) sum_s g_s[j]

(exactly `jaxroll.measure.measure`'s ``influence``). Against a predicted
profile p (N,), `score` reports

- ``W1(p, m) = sum_{j < N-1} |F_p(j) - F_m(j)| / (N - 1)`` (cumulative sums
  F; as `jaxroll.metrics.wasserstein`), Spearman's rho between p and m (ties
  get their average rank), ``KL(m || p) = sum_j m_j log(m_j / p_j)`` in nats
  (the direction of `jaxroll.fit`'s loss: data against model; +inf where
  p_j = 0 < m_j);
- bootstrap confidence intervals for each: B resamples of the S sequences
  with replacement (``numpy.random.default_rng(seed)``), the statistic of
  each resampled mean profile, the percentile interval
  ``[q_{(1-level)/2}, q_{(1+level)/2}]``;
- the noise floor: the distribution of ``W1(m_A, m_B)`` between the
  normalised means of two disjoint random halves A, B (size
  ``floor(S / 2)`` each) over `splits` random splits (one split is not an
  estimate: the even/odd and first/second-half splits of one measurement
  can differ six-fold). ``floor`` is its median, ``floor_interval`` its
  percentile interval;
- ``ratio = W1(p, m) / floor`` with a bootstrap interval: in resample b,
  ``ratio_b = W1(p, m_b) / floor_b`` with ``floor_b`` the median split-half
  W1 over `resample_splits` random splits of that resample's S draws into
  halves, so the interval carries the uncertainty of both W1 and the floor
  (not the noise of one split). A ratio whose interval lies above 1 is a
  prediction distinguishable from the measurement's own noise.

The split-half floor measures the distance between two means of S/2
sequences, i.e. sqrt(2) x sqrt(2) = 2 times the standard error of the
full mean's position in every coordinate; a perfect prediction has
``W1(p, m)`` about half the floor, not equal to it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Score", "score", "profile_from_rows", "wasserstein", "spearman", "kl", "split_half_floor"]


@dataclasses.dataclass(frozen=True)
class Score:
    """The result of `score`; intervals are ``(low, high)`` percentile intervals at `level`.

    ``w1, spearman, kl``: on the full measurement; ``*_interval``: bootstrap
    over sequences. ``floor``: median split-half W1; ``floor_interval``: its
    spread over random splits; ``ratio = w1 / floor`` and its bootstrap
    interval. ``floor_samples (splits,)`` and ``bootstrap`` (name -> (B,))
    hold the raw draws.
    """

    w1: float
    w1_interval: tuple
    spearman: float
    spearman_interval: tuple
    kl: float
    kl_interval: tuple
    floor: float
    floor_interval: tuple
    ratio: float
    ratio_interval: tuple
    sequences: int
    resamples: int
    splits: int
    resample_splits: int
    seed: int
    level: float
    floor_samples: np.ndarray = dataclasses.field(repr=False)
    bootstrap: dict = dataclasses.field(repr=False)

    def as_dict(self) -> dict:
        """The numbers as a JSON-ready dict (no raw draws)."""
        return {field.name: (list(value) if isinstance(value, tuple) else value)
                for field in dataclasses.fields(self)
                for value in [getattr(self, field.name)] if field.name not in ("floor_samples", "bootstrap")}


def profile_from_rows(weights, rows):
    """Normalised weighted means ``(w @ rows) / sum(w @ rows)``: ``(K, S) x (S, N) -> (K, N)``."""
    means = np.asarray(weights, dtype=np.float64) @ rows
    return means / means.sum(axis=-1, keepdims=True)


def wasserstein(p, q):
    """``sum_{j < N-1} |F_p(j) - F_q(j)| / (N - 1)`` over the last axis (0 for N = 1)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    n = p.shape[-1]
    return np.abs(np.cumsum(p - q, axis=-1)[..., :-1]).sum(axis=-1) / max(n - 1, 1)


def _ranks(x):
    # Average ranks (1-based) along the last axis, ties share their mean rank.
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1, x.shape[-1])
    rows, n = flat.shape
    order = np.argsort(flat, axis=-1, kind="stable")
    ordered = np.take_along_axis(flat, order, axis=-1)
    starts = np.ones_like(ordered, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    # Every row starts a run, so one cumulative sum numbers the runs of all rows consecutively.
    runs = (np.cumsum(starts.ravel()) - 1).reshape(rows, n)
    positions = np.broadcast_to(np.arange(1, n + 1, dtype=np.float64), (rows, n))
    mean_rank = np.bincount(runs.ravel(), positions.ravel()) / np.bincount(runs.ravel())
    ranks = np.empty_like(flat)
    np.put_along_axis(ranks, order, mean_rank[runs], axis=-1)
    return ranks.reshape(x.shape)


def spearman(p, q):
    """Spearman's rho over the last axis: Pearson of average ranks (0 when a side is constant)."""
    rp, rq = _ranks(p), _ranks(q)
    rp = rp - rp.mean(axis=-1, keepdims=True)
    rq = rq - rq.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((rp * rp).sum(axis=-1) * (rq * rq).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (rp * rq).sum(axis=-1) / denominator
    return np.where(denominator > 0, rho, 0.0)


def kl(m, p):
    """``KL(m || p) = sum_j m_j log(m_j / p_j)`` over the last axis, in nats; 0 log 0 = 0."""
    m, p = np.broadcast_arrays(np.asarray(m, dtype=np.float64), np.asarray(p, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(m > 0, m * (np.log(m) - np.log(p)), 0.0)
    return terms.sum(axis=-1)


def _check(rows):
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] < 2 or rows.shape[1] < 1:
        raise ValueError(f"measured_per_sequence: shape {rows.shape}; allowed: (S, N) with S >= 2")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise ValueError("measured_per_sequence: allowed: finite, non-negative values (every row measured)")
    return rows


def split_half_floor(measured_per_sequence, *, splits: int = 1000, seed: int = 0):
    """W1 between the normalised means of two disjoint random halves, for `splits` random splits, ``(splits,)``.

    Each split permutes the S sequences (``default_rng(seed)``) and compares
    the first ``floor(S / 2)`` with the next ``floor(S / 2)``.
    """
    rows = _check(measured_per_sequence)
    rng = np.random.default_rng(seed)
    return _floor(rows, splits, rng)


def _floor(rows, splits, rng):
    count = rows.shape[0]
    half = count // 2
    permutations = rng.permuted(np.tile(np.arange(count), (splits, 1)), axis=1)
    return wasserstein(profile_from_rows(_counts(permutations[:, :half], count), rows),
                       profile_from_rows(_counts(permutations[:, half: 2 * half], count), rows))


def _resample_floors(rows, draws, splits, rng, chunk=64):
    # Per resample: the median split-half W1 over `splits` random splits of its draws.
    resamples, count = draws.shape
    half = count // 2
    floors = np.empty(resamples)
    for start in range(0, resamples, chunk):
        block = np.repeat(draws[start: start + chunk], splits, axis=0)  # (b * splits, S)
        block = rng.permuted(block, axis=1)
        values = wasserstein(profile_from_rows(_counts(block[:, :half], count), rows),
                             profile_from_rows(_counts(block[:, half: 2 * half], count), rows))
        floors[start: start + chunk] = np.median(values.reshape(-1, splits), axis=1)
    return floors


def _counts(indices, count):
    # (K, k) indices into S rows -> (K, S) how often each row was drawn.
    rows = indices.shape[0]
    flat = (indices + count * np.arange(rows)[:, None]).ravel()
    return np.bincount(flat, minlength=rows * count).reshape(rows, count).astype(np.float64)


def _interval(values, level):
    # Without interpolation where a value is infinite (KL with p_j = 0 < m_j): inf - inf is no number.
    method = "linear" if np.all(np.isfinite(values)) else "inverted_cdf"
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2], method=method)
    return float(low), float(high)


def score(predicted, measured_per_sequence, *, B: int = 1000, seed: int = 0, splits: int = 1000,
          level: float = 0.95, resample_splits: int = 16) -> Score:
    """W1, Spearman and KL of `predicted` against a measurement, with bootstrap intervals and the noise floor.

    Args:
        predicted: a profile ``(N,)``, non-negative, summing to 1.
        measured_per_sequence: per-sequence influence ``(S, N)``, S >= 2
            (``influence_per_sequence`` of ``measurement.npz``; any positive
            scale per row: rows are averaged, then the mean is normalised).
        B: bootstrap resamples of the sequences.
        seed: seed of ``numpy.random.default_rng`` (the resamples, then the
            splits, are drawn from it).
        splits: random half splits for the floor.
        resample_splits: random half splits of each resample for its floor
            (the median of them), for the ratio's interval.
        level: the intervals' coverage (0.95: the 2.5 % and 97.5 % quantiles).

    Returns:
        A `Score` (the estimator is in the module docstring).

    Raises:
        ValueError: shapes that do not match, negative or non-finite values.
    """
    rows = _check(measured_per_sequence)
    predicted = np.asarray(predicted, dtype=np.float64)
    if predicted.shape != rows.shape[1:]:
        raise ValueError(f"predicted: shape {predicted.shape}; allowed: ({rows.shape[1]},) like the measurement")
    if not np.all(np.isfinite(predicted)) or np.any(predicted < 0) or abs(predicted.sum() - 1) > 1e-6:
        raise ValueError("predicted: allowed: a finite, non-negative profile that sums to 1")
    if not (isinstance(B, int) and B >= 2 and isinstance(splits, int) and splits >= 1 and 0 < level < 1
            and isinstance(resample_splits, int) and resample_splits >= 1):
        raise ValueError(f"B = {B!r}, splits = {splits!r}, resample_splits = {resample_splits!r}, level = {level!r}; "
                         "allowed: B >= 2, splits >= 1, resample_splits >= 1, 0 < level < 1")
    count = rows.shape[0]
    rng = np.random.default_rng(seed)
    measured = profile_from_rows(np.full((1, count), 1.0 / count), rows)[0]

    draws = rng.integers(0, count, size=(B, count))
    resampled = profile_from_rows(_counts(draws, count), rows)
    bootstrap = {"w1": wasserstein(predicted, resampled), "spearman": spearman(predicted, resampled),
                 "kl": kl(resampled, predicted)}
    floor_b = _resample_floors(rows, draws, resample_splits, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        bootstrap["ratio"] = np.where(floor_b > 0, bootstrap["w1"] / floor_b, np.inf)
    floor_samples = _floor(rows, splits, rng)

    w1 = float(wasserstein(predicted, measured))
    floor = float(np.median(floor_samples))
    return Score(
        w1=w1, w1_interval=_interval(bootstrap["w1"], level),
        spearman=float(spearman(predicted, measured)), spearman_interval=_interval(bootstrap["spearman"], level),
        kl=float(kl(measured, predicted)), kl_interval=_interval(bootstrap["kl"], level),
        floor=floor, floor_interval=_interval(floor_samples, level),
        ratio=w1 / floor if floor > 0 else float("inf"), ratio_interval=_interval(bootstrap["ratio"], level),
        sequences=count, resamples=B, splits=splits, resample_splits=resample_splits, seed=seed, level=level,
        floor_samples=floor_samples, bootstrap=bootstrap)
