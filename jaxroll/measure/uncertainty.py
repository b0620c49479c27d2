"""How far a predicted profile is from a measurement, judged against the noise of the measurement's mean.

Pure NumPy (imports without torch or JAX). A measurement of S sequences
gives per-sequence gradient norms ``g_s (N,)`` (``influence_per_sequence``
in ``measurement.npz``); the measured profile is their normalised mean

    m = sum_s g_s / sum_{s, j} g_s[j] = sum_s w_s r_s / sum_s w_s,

``r_s = g_s / w_s`` each sequence's own profile and ``w_s = sum_j g_s[j]``
its gradient mass (exactly `jaxroll.measure.measure`'s ``influence``): a
sequence weighs by its mass, so the effective number of sequences is
Kish's ``n_eff = (sum_s w_s)^2 / sum_s w_s^2 <= S``.

Resampling: B resamples of the S sequences with replacement
(``numpy.random.default_rng(seed)``), each giving a mean profile ``m*_b``
formed from the drawn rows as m is from all of them. Against a prediction
p (N,), `score` reports

- ``noise``: the median over resamples of ``W1(m*_b, m) sqrt(S / (S - 1))``
  (the factor undoes the plug-in variance of a resampled mean), the
  typical distance of a mean of these sequences from the profile they
  were drawn around; ``noise_q95`` its 95 % quantile. A perfect prediction
  has ``W1(p, m)`` about ``noise``. (Two random halves of S/2 sequences
  sit about twice as far apart: a split-half floor is this scale doubled
  and noisier, so it is not reported.)
- ``ratio = W1(p, m) / noise`` (about 1 for a perfect prediction) and
  ``ratio_interval = w1_interval / noise`` (the noise held fixed: its own
  spread over measurements is about 8 % in the simulation);
- ``p_value``: the one-sided test of H0 "p is the profile the sequences
  were drawn around". Under H0, ``W1(p, m)`` is distributed as the
  distance of a mean from its centre, which the (scaled) bootstrap
  distances above estimate, so
  ``p_value = (1 + #{b: noise_b >= W1(p, m)}) / (B + 1)``;
- for each metric theta in (W1, Spearman, KL) of p against m:
  ``W1(p, m) = sum_{j < N-1} |F_p(j) - F_m(j)| / (N - 1)`` (cumulative sums
  F; as `jaxroll.metrics.wasserstein`), Spearman's rho (average ranks for
  ties), ``KL(m || p) = sum_j m_j log(m_j / p_j)`` in nats (+inf where
  p_j = 0 < m_j):

  * the estimate ``theta_hat = theta(p, m)``;
  * ``*_bias_corrected = 2 theta_hat - mean_b theta(p, m*_b)``: noise only
    adds distance (``E KL(m* || p) = KL(m || p) + E KL(m* || m)`` to first
    order), so the resampled metric sits above the estimate by about as much
    as the estimate sits above the truth;
  * ``*_interval`` at `level`, clipped to the metric's range (W1/(N-1) in
    [0, 1], rho in [-1, 1], KL >= 0): for Spearman and KL the hull of the
    basic and percentile bootstrap intervals (`bootstrap_interval`); for
    W1 the hull of those two and the studentised (bootstrap-t) interval
    (`studentised_interval`) with the linearised standard error below.
    For W1 and KL the lower end is 0 whenever the one-sided test above
    keeps H0 at ``(1 - level) / 2`` (zero distance is H0, and a two-sided
    interval at `level` leaves ``(1 - level) / 2`` below its lower end: it
    reaches 0 unless that test rejects). Coverage by
    simulation with known truths: ``benchmarks/uncertainty.py`` and
    docs/uncertainty.md (at 95 %, over 2000 replicates: W1 94.8-96.8 % at
    0-8 noise units; KL 100 %; Spearman about 75 %, as rank correlation
    with a noisy mean is attenuated more than the bootstrap sees).

The W1 standard error (`w1_linear_terms`, `w1_standard_error`): with
counts c_s of each sequence (all 1 for the measurement, the drawn
multiplicities for a resample), ``m(c) = sum_s c_s g_s / sum_s c_s w_s``,
and at each c the linear terms (S times the derivative of W1 in c_s)

    L_s = sum_{j < N-1} sign(F_m(j) - F_p(j)) (G_s(j) - w_s F_m(j)) / ((N - 1) wbar),

``m = m(c)``, ``G_s`` the cumulative sum of g_s and ``wbar = sum_s c_s w_s /
S``; ``sum_s c_s L_s = 0``. W1 is linear in F_m away from the positions
where F_m crosses F_p, so a mean of S fresh sequences differs from the
truth's W1 by about the mean of S such terms, and

    se = sqrt(sum_s c_s L_s^2 / (S (S - 1))).

The studentised interval: ``t*_b = (W1(p, m*_b) - W1_hat) / se*_b``, se*_b
formed from the resample's own m*_b and counts, and ``[W1_hat - t_hi se_hat,
W1_hat - t_lo se_hat]`` with ``t_lo, t_hi`` the ``(1 -+ level) / 2``
quantiles of t*. It allows for the spread of the standard error itself
(about 14 % between measurements in the simulation, heavy-tailed gradient
masses): the basic and percentile intervals do not. Near W1's kink
(errors of about 2 noise units, where F_m crosses F_p) the linearisation
fails (the studentised interval alone covers about 82 %) and the
percentile interval covers: hence the hull.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import ConfigError

__all__ = ["Score", "score", "profile_from_rows", "resample_counts", "resample_profiles", "profile_band",
           "effective_sequences", "check_rows", "bootstrap_interval", "studentised_interval", "w1_linear_terms",
           "w1_standard_error", "bias_corrected", "wasserstein", "spearman", "kl", "JSON_FIELDS", "RANGES"]

RANGES = {"w1": (0.0, 1.0), "spearman": (-1.0, 1.0), "kl": (0.0, np.inf)}
"""The range each metric's bias-corrected estimate and interval are clipped to."""

JSON_FIELDS = ("w1", "w1_bias_corrected", "w1_interval", "noise", "noise_q95", "ratio", "ratio_interval",
               "p_value", "n_eff", "spearman", "spearman_bias_corrected", "spearman_interval", "kl",
               "kl_bias_corrected", "kl_interval", "sequences", "level", "resamples", "seed")
"""The keys of `Score.as_dict` (and ``jaxroll score --json``), in order; stable for scripts."""


@dataclasses.dataclass(frozen=True)
class Score:
    """The result of `score` (the estimators are in the module docstring).

    ``w1, spearman, kl``: on the full measurement; ``*_bias_corrected``:
    ``2 theta_hat - mean(theta*)``; ``*_interval``: bootstrap intervals at
    `level` (W1: with the studentised one), clipped to the metric's range;
    ``w1_standard_error``: W1's linearised standard error. ``noise``,
    ``noise_q95``: the median and 95 % quantile of the bootstrap
    ``W1(m*, m)``; ``ratio = w1 / noise`` and ``ratio_interval =
    w1_interval / noise``; ``p_value`` for H0 "the sequences were drawn
    around p"; ``n_eff``: Kish's effective number of sequences.
    ``bootstrap`` (name -> (B,)) holds the raw draws (``w1, spearman,
    kl, noise``, and ``w1_standard_error``, each resample's se*_b).
    """

    w1: float
    w1_bias_corrected: float
    w1_interval: tuple
    noise: float
    noise_q95: float
    ratio: float
    ratio_interval: tuple
    p_value: float
    n_eff: float
    spearman: float
    spearman_bias_corrected: float
    spearman_interval: tuple
    kl: float
    kl_bias_corrected: float
    kl_interval: tuple
    sequences: int
    level: float
    resamples: int
    seed: int
    w1_standard_error: float
    bootstrap: dict = dataclasses.field(repr=False)

    def as_dict(self) -> dict:
        """The numbers as a JSON-ready dict with the keys `JSON_FIELDS` (no raw draws)."""
        return {name: (list(value) if isinstance(value, tuple) else value)
                for name in JSON_FIELDS for value in [getattr(self, name)]}

    def verdict(self) -> str:
        """One line: what was tested, the p-value, and the decision at ``alpha = 1 - level``."""
        alpha = 1 - self.level
        decision = (f"rejected at alpha = {alpha:.2g}: the prediction is not the centre of these sequences"
                    if self.p_value <= alpha else
                    f"not rejected at alpha = {alpha:.2g}: the measurement cannot tell the prediction "
                    "from the profile it was drawn around")
        return (f"test of H0 'the sequences were drawn around the prediction' (W1(p, m) against the "
                f"bootstrap W1(m*, m)): p = {self.p_value:.3g}, {decision}; W1 = {self.ratio:.3g}x the noise "
                f"of the mean")


def profile_from_rows(weights, rows):
    """Normalised weighted means ``(w @ rows) / sum(w @ rows)``: ``(K, S) x (S, N) -> (K, N)``."""
    means = np.asarray(weights, dtype=np.float64) @ rows
    return means / means.sum(axis=-1, keepdims=True)


def resample_counts(count: int, resamples: int, rng):
    """``(B, S)`` multiplicities of S sequences drawn with replacement: ``Multinomial(S, 1/S)`` rows, float64."""
    return rng.multinomial(count, np.full(count, 1.0 / count), size=resamples).astype(np.float64)


def resample_profiles(rows, resamples: int, rng):
    """``(B, N)`` bootstrap mean profiles: rows drawn with replacement, each draw's mean normalised as m is."""
    return profile_from_rows(resample_counts(rows.shape[0], resamples, rng), rows)


def w1_linear_terms(predicted, rows, counts):
    """``(K, S)`` linear terms ``L_s`` of ``W1(p, m(c))`` at each count vector ``c`` of `counts` ``(K, S)``.

    ``L_s = sum_{j < N-1} sign(F_m(j) - F_p(j)) (G_s(j) - w_s F_m(j)) / ((N - 1) wbar)``
    with ``m = m(c) = sum_s c_s g_s / sum_s c_s w_s``, F and G cumulative
    sums, ``w_s = sum_j g_s[j]`` and ``wbar = sum_s c_s w_s / S``: S times the
    derivative of W1 in c_s, so ``sum_s c_s L_s = 0``.
    """
    rows = np.asarray(rows, dtype=np.float64)
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    sequences, n = rows.shape
    masses = rows.sum(axis=1)
    cumulative = np.cumsum(profile_from_rows(counts, rows), axis=-1)[:, :-1]  # (K, N-1)
    signs = np.sign(cumulative - np.cumsum(np.asarray(predicted, dtype=np.float64))[:-1])
    along = signs @ np.cumsum(rows, axis=1)[:, :-1].T  # (K, S): sum_j sign_j G_s(j)
    terms = along - masses * np.sum(signs * cumulative, axis=1, keepdims=True)
    return terms / ((max(n - 1, 1) * (counts @ masses) / sequences)[:, None])


def w1_standard_error(predicted, rows, counts=None):
    """Linearised standard error of ``W1(p, m(c))``: ``sqrt(sum_s c_s L_s^2 / (S (S - 1)))`` (`w1_linear_terms`).

    `counts` ``(K, S)`` gives ``(K,)``; None (all ones: the measurement
    itself) gives a float.
    """
    rows = np.asarray(rows, dtype=np.float64)
    sequences = rows.shape[0]
    given = np.ones((1, sequences)) if counts is None else np.atleast_2d(np.asarray(counts, dtype=np.float64))
    terms = w1_linear_terms(predicted, rows, given)
    errors = np.sqrt(np.sum(given * terms ** 2, axis=1) / (sequences * (sequences - 1)))
    return float(errors[0]) if counts is None else errors


def studentised_interval(estimate: float, draws, standard_error: float, draw_errors, level: float) -> tuple:
    """The bootstrap-t interval ``[theta_hat - t_hi se_hat, theta_hat - t_lo se_hat]`` at `level` (not clipped).

    ``t*_b = (theta*_b - theta_hat) / se*_b`` over the draws with
    ``se*_b > 0``; ``t_lo, t_hi`` their ``(1 -+ level) / 2`` quantiles. With
    ``se_hat = 0`` or fewer than 2 usable draws (every resample the same
    profile) the interval is ``(theta_hat, theta_hat)``.
    """
    draws, draw_errors = np.asarray(draws, dtype=np.float64), np.asarray(draw_errors, dtype=np.float64)
    usable = draw_errors > 0
    if not (np.isfinite(estimate) and standard_error > 0 and np.count_nonzero(usable) >= 2):
        return float(estimate), float(estimate)
    pivots = (draws[usable] - estimate) / draw_errors[usable]
    low, high = np.quantile(pivots, [(1 - level) / 2, (1 + level) / 2])
    return float(estimate - high * standard_error), float(estimate - low * standard_error)


def profile_band(measured_per_sequence, *, level: float = 0.95, resamples: int = 1000, seed: int = 0):
    """Pointwise bootstrap band of the measured profile, ``(2, N)``: the (1 -+ level)/2 quantiles of ``m*_j``.

    Pointwise, not simultaneous: each position's interval covers its own
    mean at about `level`. The mean of a position is near linear in the
    rows, so the percentile band has no bias to correct.
    """
    rows = check_rows(measured_per_sequence)
    profiles = resample_profiles(rows, resamples, np.random.default_rng(seed))
    return np.quantile(profiles, [(1 - level) / 2, (1 + level) / 2], axis=0)


def effective_sequences(measured_per_sequence) -> float:
    """Kish's effective number ``(sum_s w_s)^2 / sum_s w_s^2`` with ``w_s = sum_j g_s[j]`` (S when all weigh alike)."""
    weights = np.asarray(measured_per_sequence, dtype=np.float64).sum(axis=1)
    return float(weights.sum() ** 2 / np.sum(weights ** 2))


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


def bootstrap_interval(estimate: float, draws, level: float, bounds=(-np.inf, np.inf)) -> tuple:
    """The hull of the basic and percentile bootstrap intervals of `draws` at `level`, clipped to `bounds`.

    With ``q_lo, q_hi`` the ``(1 -+ level) / 2`` quantiles of the draws: the
    basic interval ``[2 theta_hat - q_hi, 2 theta_hat - q_lo]`` reflects the
    bias the bootstrap shows; the percentile interval ``[q_lo, q_hi]`` keeps
    it. The hull ``[min(2 theta_hat - q_hi, q_lo), max(2 theta_hat - q_lo,
    q_hi)]`` always contains theta_hat and covers where either does: the
    basic one near 0 (W1 and KL of a near-perfect prediction, where noise
    only adds distance), the percentile one for W1 at a few noise units
    (where the bootstrap's bias is an artefact of W1's kink at 0).
    An infinite estimate (KL with p_j = 0 < m_j) gives ``(inf, inf)``.
    """
    if not np.isfinite(estimate):
        return float(estimate), float(estimate)
    draws = np.asarray(draws, dtype=np.float64)
    # Without interpolation where a draw is infinite: inf - inf is no number.
    method = "linear" if np.all(np.isfinite(draws)) else "inverted_cdf"
    low, high = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2], method=method)
    hull = min(2 * estimate - high, low), max(2 * estimate - low, high)
    return float(np.clip(hull[0], *bounds)), float(np.clip(hull[1], *bounds))


def bias_corrected(estimate: float, draws, bounds=(-np.inf, np.inf)) -> float:
    """``2 theta_hat - mean(theta*)``, clipped to `bounds` (the estimate itself where it or a draw is infinite)."""
    draws = np.asarray(draws, dtype=np.float64)
    if not (np.isfinite(estimate) and np.all(np.isfinite(draws))):
        return float(estimate)
    return float(np.clip(2 * estimate - draws.mean(), *bounds))


def check_rows(rows):
    """`rows` as float64 ``(S, N)``, or a `ConfigError` (a ValueError) with field ``measured_per_sequence``.

    Allowed: S >= 2, every value finite and >= 0, and at least 2 rows with
    gradient mass ``w_s = sum_j g_s[j] > 0``.
    """
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] < 2 or rows.shape[1] < 1:
        raise ConfigError(f"measured_per_sequence: shape {rows.shape}; allowed: (S, N) with S >= 2")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise ConfigError("measured_per_sequence: a value is not finite or is negative; "
                         "allowed: finite, non-negative values (every row measured)")
    if np.count_nonzero(rows.sum(axis=1) > 0) < 2:
        raise ConfigError("measured_per_sequence: fewer than 2 rows with gradient mass; allowed: at least 2")
    return rows


def score(predicted, measured_per_sequence, *, B: int = 1000, seed: int = 0, level: float = 0.95) -> Score:
    """W1, Spearman and KL of `predicted` against a measurement, judged against the noise of its mean.

    Args:
        predicted: a profile ``(N,)``, non-negative, summing to 1.
        measured_per_sequence: per-sequence influence ``(S, N)``, S >= 2
            (``influence_per_sequence`` of ``measurement.npz``; each row
            weighs by its sum, as in the measured profile).
        B: bootstrap resamples of the sequences.
        seed: seed of ``numpy.random.default_rng``.
        level: the intervals' coverage (0.95: the 2.5 % and 97.5 % quantiles);
            the verdict tests at ``alpha = 1 - level``.

    Returns:
        A `Score` (the estimators are in the module docstring).

    Raises:
        ValueError: shapes that do not match, negative or non-finite values.
    """
    rows = check_rows(measured_per_sequence)
    predicted = np.asarray(predicted, dtype=np.float64)
    if predicted.shape != rows.shape[1:]:
        raise ValueError(f"predicted: shape {predicted.shape}; allowed: ({rows.shape[1]},) like the measurement")
    if not np.all(np.isfinite(predicted)) or np.any(predicted < 0) or abs(predicted.sum() - 1) > 1e-6:
        raise ValueError("predicted: allowed: a finite, non-negative profile that sums to 1")
    if not (isinstance(B, int) and B >= 2 and 0 < level < 1):
        raise ValueError(f"B = {B!r}, level = {level!r}; allowed: B >= 2, 0 < level < 1")
    count = rows.shape[0]
    measured = profile_from_rows(np.ones((1, count)), rows)[0]
    counts = resample_counts(count, B, np.random.default_rng(seed))
    resampled = profile_from_rows(counts, rows)
    bootstrap = {"w1_standard_error": w1_standard_error(predicted, rows, counts),
                 "w1": wasserstein(predicted, resampled), "spearman": spearman(predicted, resampled),
                 "kl": kl(resampled, predicted),
                 # A resampled mean spreads sqrt((S - 1) / S) as far as a sample's mean does (plug-in variance).
                 "noise": wasserstein(resampled, measured) * math.sqrt(count / (count - 1))}
    estimates = {"w1": float(wasserstein(predicted, measured)), "spearman": float(spearman(predicted, measured)),
                 "kl": float(kl(measured, predicted))}
    fields = {}
    for name, estimate in estimates.items():
        fields[name] = estimate
        fields[f"{name}_bias_corrected"] = bias_corrected(estimate, bootstrap[name], RANGES[name])
        fields[f"{name}_interval"] = bootstrap_interval(estimate, bootstrap[name], level, RANGES[name])
    w1 = estimates["w1"]
    standard_error = w1_standard_error(predicted, rows)
    studentised = studentised_interval(w1, bootstrap["w1"], standard_error, bootstrap["w1_standard_error"], level)
    low, high = fields["w1_interval"]
    fields["w1_interval"] = (float(np.clip(min(low, studentised[0]), *RANGES["w1"])),
                             float(np.clip(max(high, studentised[1]), *RANGES["w1"])))
    noise = float(np.median(bootstrap["noise"]))
    p_value = (1 + int(np.sum(bootstrap["noise"] >= w1))) / (B + 1)
    if p_value > (1 - level) / 2:
        # Zero distance is the test's H0 (p = mu); a two-sided interval at `level` leaves (1 - level) / 2 below
        # its lower end, so it contains 0 unless the one-sided test at that size rejects (test inversion). The
        # bootstrap is unreliable at this edge of the metrics' range.
        for name in ("w1", "kl"):
            fields[f"{name}_interval"] = (0.0, fields[f"{name}_interval"][1])
    ratio = w1 / noise if noise > 0 else (0.0 if w1 == 0 else np.inf)
    ratio_interval = tuple(v / noise if noise > 0 else (0.0 if v == 0 else np.inf) for v in fields["w1_interval"])
    return Score(**fields, noise=noise, noise_q95=float(np.quantile(bootstrap["noise"], 0.95)),
                 ratio=float(ratio), ratio_interval=ratio_interval, p_value=p_value,
                 n_eff=effective_sequences(rows), sequences=count, level=level, resamples=B, seed=seed,
                 w1_standard_error=standard_error, bootstrap=bootstrap)
