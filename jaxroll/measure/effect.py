"""Scoring a predicted change: a baseline and an intervened measurement against the rollout's prediction.

Pure NumPy (imports without torch or JAX), seeded; the calibrated
statistics of one measurement are `jaxroll.measure.uncertainty`'s, reused
here. Two measurements of S_B and S_I sequences give per-sequence gradient
norms ``g_s`` (baseline) and ``h_s`` (intervened), ``(S, N)`` each
(``influence_per_sequence`` of ``measurement.npz``), and mean profiles

    m_B = sum_s g_s / sum_{s, j} g_s[j],        m_I = sum_s h_s / sum_{s, j} h_s[j]

(each sequence weighs by its gradient mass, as in `uncertainty`). The
prediction is the rollout's profile ``p_I (N,)`` of the intervened model and,
optionally, ``p_B`` of the baseline model.

**Pairing.** When both measurements read the same texts (``token_ids``
equal, row by row) sequence s of one is sequence s of the other: a
resample draws the same sequences from both (shared counts), so what the
two rows of a sequence share (the text's own profile) cancels from the
difference. Otherwise the two are resampled independently (`pairing`).

**Is there an effect?** ``W1(m_I, m_B)`` (W1/(N-1) as `uncertainty.wasserstein`)
against the **noise of the difference**: B resamples with counts ``c^B, c^I``
(shared when paired) give centred differences

    d*_b = sqrt(S_I / (S_I - 1)) (m_I*_b - m_I) - sqrt(S_B / (S_B - 1)) (m_B*_b - m_B),

and ``effect_noise`` is the median of ``W1(d*_b, 0) = sum_{j < N-1} |sum_{i <= j}
d*_b[i]| / (N - 1)`` (the factors undo the plug-in variance of a resampled
mean, as in `uncertainty.score`): how far apart two means of these
sequences sit when nothing changed. ``effect_ratio = W1(m_I, m_B) /
effect_noise`` is about 1 without an effect. Its p-value is a
**permutation test** of H0 "the intervention does not change the
profile": each measurement's rows are first divided by their mean mass
(an intervention may rescale every gradient, e.g. a temperature; that
leaves m unchanged and is not the effect tested), then

- paired: the two rows of each sequence swap with probability 1/2 (the
  sign flip of the per-sequence difference ``h_s - g_s``);
- unpaired: the S_B + S_I rows are pooled and relabelled at random;

and ``effect_p_value = (1 + #{b : W1(m_I^pi_b, m_B^pi_b) >= W1(m_I, m_B)}) / (B + 1)``.

**The prediction** against the intervened measurement is `uncertainty.score`
``(p_I, h)``, unchanged: ``W1(p_I, m_I)`` over the noise of ``m_I`` and its
p-value for H0 "the intervened sequences were drawn around p_I".

**The anchored prediction** (with p_B): the rollout's predicted *ratio*
applied to what was measured,

    a_I = m_B p_I / p_B / sum_j (m_B p_I / p_B)[j]        (`anchored_profile`),

scored like p_I (``anchored``). A rollout that is off in the baseline's
shape but right in how an intervention changes it predicts a_I better than
p_I; on the validation models of docs/interventions.md it mostly does.

**Changes of shape.** For f in (``middle_mass``, ``center_of_mass``), as
`jaxroll.metrics` defines them (`middle_mass`, `center_of_mass` below):

- measured change ``f(m_I) - f(m_B)``, bootstrap draws ``f(m_I*_b) - f(m_B*_b)``;
- predicted change ``f(p_I) - f(p_B)`` when p_B is given (no sampling noise:
  its interval is the point): the rollout's own change, the headline
  (`HEADLINES`) and what `jaxroll effect` reports by default; else
  ``f(p_I) - f(m_B)`` with draws ``f(p_I) - f(m_B*_b)``, a predicted profile
  minus a measured one, which can differ from the rollout's change even in
  sign (`Change.reference` says which);
- ``miss`` = measured change - predicted change, with its draws;

each interval the hull of the basic and percentile intervals at `level`
(`uncertainty.bootstrap_interval`), clipped to [-1, 1].

**Checked folders.** `check_pair` refuses, in one line, two measurement
folders that cannot be compared: the same folder twice, other models
(metadata.json's model and architecture), another N, other token ids
(unless compared unpaired on purpose), and a baseline measured under
interventions (the folders swapped, or both intervened).
`baseline_prediction` rolls out a baseline measurement's config.yaml at N:
the p_B of the headline change when none is given.

**Against "no change".** Predicting that nothing changes scores ``W1(m_B,
m_I)`` (the effect's W1); the prediction scores ``W1(p_I, m_I)``.
``advantage = W1(m_B, m_I) - W1(p_I, m_I)`` (> 0: the prediction is nearer
the intervened measurement than the baseline is) with draws
``W1(m_B*_b, m_I*_b) - W1(p_I, m_I*_b)`` and the hull interval;
``beats_no_change`` is whether that interval lies above 0.

References: arXiv 2602.16837 (the residual-aware rollout and its
position-bias predictions); docs/interventions.md, "Scoring a predicted change".
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import ConfigError
from .uncertainty import (Score, bootstrap_interval, check_rows, profile_band, profile_from_rows, resample_counts,
                          score, wasserstein)

__all__ = ["Effect", "Change", "effect", "write_effect", "pairing", "anchored_profile", "middle_mass", "center_of_mass",
           "CHANGE_METRICS", "HEADLINES", "check_pair", "baseline_prediction", "MODEL_FIELDS"]

CHANGE_METRICS = ("middle_mass", "center_of_mass")
"""The shape statistics whose predicted and measured changes `effect` reports (as `jaxroll.metrics`)."""

HEADLINES = {"predicted baseline": "predicted change = rollout(intervened) - rollout(baseline)",
             "measured baseline": "predicted change = rollout(intervened) - measured baseline"}
"""What the predicted change is, by `Change.reference`: ``headline`` of `Effect.as_dict` (effect.json)."""

MODEL_FIELDS = ("model_class", "model_type", "layer_map", "num_layers", "num_heads", "head_dim",
                "position_encoding", "attention_windows", "parallel_block")
"""The architecture record of metadata.json (`jaxroll.measure.pass_setup.run_metadata`) that two compared
measurements share; ``model`` (the folder or name measured) is compared too (`check_pair`)."""


def middle_mass(profile, fraction: float = 0.1):
    """``sum p[k : N - k]`` over the last axis, ``k = max(1, round(fraction N))`` (`jaxroll.metrics.middle_mass`).

    NumPy float64, so that this module needs no JAX; tests pin it to the
    JAX definition.
    """
    profile = np.asarray(profile, dtype=np.float64)
    n = profile.shape[-1]
    k = max(1, round(fraction * n))
    return profile[..., k:max(k, n - k)].sum(axis=-1)


def center_of_mass(profile):
    """``sum_j j p_j / (N - 1)`` over the last axis (0 for N = 1; `jaxroll.metrics.center_of_mass`)."""
    profile = np.asarray(profile, dtype=np.float64)
    n = profile.shape[-1]
    return profile @ np.arange(n, dtype=np.float64) / max(n - 1, 1)


def anchored_profile(measured_baseline, predicted_baseline, predicted):
    """``m_B p_I / p_B``, renormalised: the rollout's predicted ratio applied to the measured baseline.

    Where ``p_B = 0`` the ratio is taken as 1 (the rollout says nothing there).
    """
    measured_baseline, predicted_baseline, predicted = (np.asarray(x, dtype=np.float64) for x in
                                                        (measured_baseline, predicted_baseline, predicted))
    positive = predicted_baseline > 0
    ratio = np.where(positive, predicted / np.where(positive, predicted_baseline, 1.0), 1.0)
    profile = measured_baseline * ratio
    return profile / profile.sum()


@dataclasses.dataclass(frozen=True)
class Change:
    """The predicted and measured change of one shape statistic f, each with its interval at `level`.

    ``measured = f(m_I) - f(m_B)``; ``predicted = f(p_I) - f(reference)``
    with `reference` ``"predicted baseline"`` (p_B) or ``"measured
    baseline"`` (m_B); ``miss = measured - predicted``. Intervals are
    ``(low, high)``; a predicted change against the predicted baseline has
    no sampling noise, so its interval is ``(predicted, predicted)``.
    """

    name: str
    measured_baseline: float
    measured_intervened: float
    predicted_intervened: float
    reference: str
    reference_value: float
    measured: float
    measured_interval: tuple
    predicted: float
    predicted_interval: tuple
    miss: float
    miss_interval: tuple

    def as_dict(self) -> dict:
        """Every field, intervals as lists."""
        return {field.name: (list(value) if isinstance(value, tuple) else value)
                for field in dataclasses.fields(self) for value in [getattr(self, field.name)]}


@dataclasses.dataclass(frozen=True)
class Effect:
    """What `effect` returns: the measured effect, the prediction's score, the changes of shape.

    ``effect_w1 = W1(m_I, m_B)``, ``effect_noise`` (median bootstrap
    W1 of the centred difference), ``effect_ratio = effect_w1 /
    effect_noise`` (about 1 without an effect), ``effect_p_value`` (the
    permutation test named by ``effect_test``); ``prediction``: the
    `uncertainty.Score` of p_I against the intervened rows; ``anchored``: that
    of the anchored prediction a_I (None without p_B); ``changes``:
    one `Change` per name of `CHANGE_METRICS`; ``advantage = W1(m_B, m_I) -
    W1(p_I, m_I)`` with ``advantage_interval``, and ``beats_no_change``
    (the interval's lower end > 0). ``paired`` and ``pairing`` (why).
    """

    positions: int
    sequences_baseline: int
    sequences_intervened: int
    paired: bool
    pairing: str
    effect_w1: float
    effect_noise: float
    effect_ratio: float
    effect_p_value: float
    effect_test: str
    prediction: Score
    anchored: Score | None
    changes: dict
    advantage: float
    advantage_interval: tuple
    beats_no_change: bool
    level: float
    resamples: int
    seed: int
    fraction: float

    def as_dict(self) -> dict:
        """Every number as a JSON-ready dict (``prediction``: `Score.as_dict`; ``changes``: name -> dict)."""
        record = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("prediction", "anchored"):
                value = None if value is None else value.as_dict()
            elif field.name == "changes":
                value = {name: change.as_dict() for name, change in value.items()}
            elif isinstance(value, tuple):
                value = list(value)
            record[field.name] = value
        record["no_change_w1"] = self.effect_w1  # W1(m_B, m_I): "no change" predicts m_B
        record["headline"] = self.headline
        return record

    @property
    def headline(self) -> str:
        """What the predicted change is (`HEADLINES`): the rollout's own, or against the measured baseline."""
        return HEADLINES[next(iter(self.changes.values())).reference]

    def verdict(self) -> str:
        """One line: is there an effect, at ``alpha = 1 - level``."""
        alpha = 1 - self.level
        decision = (f"rejected at alpha = {alpha:.2g}: the intervention changed the measured profile"
                    if self.effect_p_value <= alpha else
                    f"not rejected at alpha = {alpha:.2g}: no change is seen above the noise")
        return (f"test of H0 'the intervention does not change the profile' ({self.effect_test}): "
                f"p = {self.effect_p_value:.3g}, {decision}; W1 = {self.effect_ratio:.3g}x the noise of the difference")


def pairing(baseline_tokens, intervened_tokens) -> tuple[bool, str]:
    """Whether two measurements read the same texts: ``(paired, why)``.

    Paired exactly when both ``token_ids`` are given and equal, shape and
    every id, row by row (sequence s of one is sequence s of the other).
    """
    if baseline_tokens is None or intervened_tokens is None:
        return False, "unpaired: a measurement records no token_ids"
    first, second = np.asarray(baseline_tokens), np.asarray(intervened_tokens)
    if first.shape != second.shape:
        return False, f"unpaired: token_ids of shapes {first.shape} and {second.shape}"
    if not np.array_equal(first, second):
        rows = int(np.count_nonzero(np.any(first != second, axis=tuple(range(1, first.ndim)))))
        return False, f"unpaired: the token_ids differ in {rows} of {first.shape[0]} sequences"
    return True, f"paired: the same {first.shape[0]} texts (equal token_ids)"


def interventions_of(metadata) -> str:
    """The interventions a measurement was made under (``interventions`` of its metadata.json, as `jaxroll
    measure --intervene` records them) as ``name=value, ...``; "" when it records none."""
    record = None if metadata is None else metadata.get("interventions")
    if isinstance(record, dict):
        return ", ".join(f"{name}={value}" for name, value in record.items())
    return "" if not record else str(record)


def _same_path(first, second) -> bool:
    """The same name, or two spellings of one existing folder (metadata.json's ``model``, the folders compared)."""
    import os

    if first == second:
        return True
    try:
        return first is not None and second is not None and os.path.samefile(first, second)
    except OSError:
        return False


def _positions(saved) -> int | None:
    for name in ("influence_per_sequence", "token_ids"):
        if name in saved.arrays and np.ndim(saved.arrays[name]) >= 2:
            return int(np.shape(saved.arrays[name])[-1])
    return None


def check_pair(folders, baseline, intervened, *, same_texts: bool = True) -> tuple[bool, str]:
    """Refuse two measurements that cannot be compared as baseline and intervened; else `pairing`'s answer.

    `folders`: the two folders as the user named them, ``(BASELINE, INTERVENED)``;
    `baseline`, `intervened`: their `jaxroll.measure.outputs.SavedMeasurement`,
    with metadata.json. One-line `ConfigError` (field ``--measured``), in this
    order, when: the two are one folder; the models differ (``model`` or a
    field of `MODEL_FIELDS` in metadata.json); N differs; the baseline was
    measured under interventions (metadata.json's ``interventions``: the
    folders swapped when the intervened one records none); the token ids
    differ or are missing, unless `same_texts` is False (``--unpaired``:
    different texts compared unpaired, on purpose). Returns ``(paired, why)``.
    """
    import os

    base, other = (str(folder) for folder in folders)
    if os.path.abspath(base) == os.path.abspath(other) or _same_path(base, other):
        raise ConfigError(f"--measured {base} --measured {other}: the same folder twice; allowed: two "
                          "measurements, the baseline model's, then the intervened model's", field="--measured",
                          value=[base, other], allowed="two different folders")
    for name in ("model", *MODEL_FIELDS):
        first, second = baseline.metadata.get(name), intervened.metadata.get(name)
        if name in baseline.metadata and name in intervened.metadata and not (
                _same_path(first, second) if name == "model" else first == second):
            raise ConfigError(f"--measured {other}: {name} {second!r} in metadata.json, the baseline --measured "
                              f"{base} has {first!r}; allowed: two measurements of one model", field="--measured",
                              value=other, allowed="measurements of one model")
    lengths = _positions(baseline), _positions(intervened)
    if lengths[0] != lengths[1]:
        raise ConfigError(f"--measured {other}: N = {lengths[1]} positions per sequence; allowed: N = {lengths[0]}, "
                          f"as the baseline --measured {base}", field="--measured", value=other,
                          allowed=f"N = {lengths[0]}")
    applied = interventions_of(baseline.metadata)
    if applied:
        swapped = not interventions_of(intervened.metadata)
        raise ConfigError(f"--measured {base}: the baseline was measured under --intervene {applied}"
                          + (f" and --measured {other} under none: swapped? allowed: --measured BASELINE --measured "
                             "INTERVENED, in this order" if swapped else
                             "; allowed: a baseline measured without --intervene"),
                          field="--measured", value=base, allowed="a baseline measured without --intervene")
    paired, why = pairing(baseline.arrays.get("token_ids"), intervened.arrays.get("token_ids"))
    if same_texts and not paired:
        raise ConfigError(f"--measured {other}: {why.removeprefix('unpaired: ')}; allowed: the same texts as the "
                          f"baseline (jaxroll measure with the same --texts, --length, --samples and tokenizer), or "
                          "--unpaired to compare different texts", field="--measured", value=other,
                          allowed="the same token_ids, or --unpaired")
    return paired, why


def baseline_prediction(directory, length: int):
    """The rollout's profile ``p_B (length,)`` of a baseline measurement: its config.yaml rolled out at `length`.

    What ``jaxroll rollout DIRECTORY/config.yaml --length N`` writes into
    profile.csv, divided by its sum: at small N (an ALiBi or measured dense
    kernel, `jaxroll.numpy_rollout.is_small`) the NumPy float64 rollout, equal
    to the JAX one in float64 to 1e-12 and imported without JAX; otherwise
    `jaxroll.bucket.influence_with_mass` (the default method and precision,
    float32 rounding), JAX imported here only. A one-line `ConfigError` (field
    ``--predicted-baseline``) when the folder has no config.yaml (measured
    without lambda) or it cannot be rolled out at `length`.
    """
    import dataclasses
    from pathlib import Path

    from .. import numpy_rollout

    path = Path(directory) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"--predicted-baseline: not given, and the baseline --measured {directory} has no "
                          "config.yaml to roll out; allowed: --predicted-baseline PROFILE.csv (the profile.csv of "
                          "jaxroll rollout on the baseline model)", field="--predicted-baseline", value=None,
                          allowed="--predicted-baseline PROFILE.csv")
    small = numpy_rollout.read_config(path)
    if small is not None and small.check_length(int(length)) and numpy_rollout.is_small(small, int(length)):
        profile = numpy_rollout.influence_with_mass(small, int(length))[0]
        return profile / profile.sum()
    from .. import io
    from ..bucket import influence_with_mass

    try:
        model = dataclasses.replace(io.load_config(path), sequence_length=int(length))
        model.kernel.check_length(int(length))
        profile = np.asarray(influence_with_mass(model)[0], dtype=np.float64)
    except ConfigError as error:
        raise ConfigError(f"--measured {directory}: config.yaml: {error}; allowed: --predicted-baseline "
                          "PROFILE.csv", field="--predicted-baseline", allowed="--predicted-baseline PROFILE.csv"
                          ) from None
    if not np.all(np.isfinite(profile)):
        raise ConfigError(f"--measured {directory}: config.yaml rolls out to a profile that is not finite; allowed: "
                          "--predicted-baseline PROFILE.csv (jaxroll rollout --float64)", field="--predicted-baseline")
    return profile / profile.sum()


def _draw_counts(baseline: int, intervened: int, resamples: int, paired: bool, rng):
    """``(B, S_B), (B, S_I)`` bootstrap multiplicities; one draw for both when `paired` (same sequences)."""
    counts = resample_counts(baseline, resamples, rng)
    return counts, (counts if paired else resample_counts(intervened, resamples, rng))


def _inflation(count: int) -> float:
    # A resampled mean spreads sqrt((S - 1) / S) as far as a sample's mean does (plug-in variance).
    return math.sqrt(count / (count - 1))


def _permuted_distances(baseline_rows, intervened_rows, paired: bool, permutations: int, rng):
    """``(B,)`` ``W1(m_I^pi, m_B^pi)`` under H0's relabellings (module docstring): swaps within pairs, or pooled."""
    # Each measurement at mean mass 1: a global rescaling of the gradients is not the effect tested.
    g = baseline_rows / baseline_rows.sum(axis=1).mean()
    h = intervened_rows / intervened_rows.sum(axis=1).mean()
    if paired:
        swapped = rng.integers(0, 2, size=(permutations, g.shape[0])).astype(np.float64)
        intervened = (1 - swapped) @ h + swapped @ g
        baseline = swapped @ h + (1 - swapped) @ g
    else:
        pooled = np.concatenate([g, h])
        chosen = (rng.random((permutations, pooled.shape[0])).argsort(axis=1) < h.shape[0]).astype(np.float64)
        intervened, baseline = chosen @ pooled, (1 - chosen) @ pooled
    return wasserstein(intervened / intervened.sum(axis=1, keepdims=True),
                       baseline / baseline.sum(axis=1, keepdims=True))


def _check_profile(name: str, profile, size: int):
    profile = np.asarray(profile, dtype=np.float64)
    if profile.shape != (size,):
        raise ValueError(f"{name}: shape {profile.shape}; allowed: ({size},) like the measurements")
    if not np.all(np.isfinite(profile)) or np.any(profile < 0) or abs(profile.sum() - 1) > 1e-6:
        raise ValueError(f"{name}: allowed: a finite, non-negative profile that sums to 1 (sum {profile.sum():.9g})")
    return profile


def _change(name: str, values: dict, measured, predicted, reference: str, level: float) -> Change:
    """A `Change` from the profiles' `values` and ``(estimate, draws)`` of the measured and predicted changes
    (draws None: a change without sampling noise)."""
    (measured_value, measured_draws), (predicted_value, predicted_draws) = measured, predicted
    bounds = (-1.0, 1.0)
    predicted_interval = (bootstrap_interval(predicted_value, predicted_draws, level, bounds)
                          if predicted_draws is not None else (predicted_value, predicted_value))
    miss_draws = measured_draws - (predicted_draws if predicted_draws is not None else predicted_value)
    return Change(name=name, **values, reference=reference, measured=measured_value,
                  measured_interval=bootstrap_interval(measured_value, measured_draws, level, bounds),
                  predicted=predicted_value, predicted_interval=predicted_interval,
                  miss=measured_value - predicted_value,
                  miss_interval=bootstrap_interval(measured_value - predicted_value, miss_draws, level, (-2.0, 2.0)))


def effect(baseline_per_sequence, intervened_per_sequence, predicted, *, predicted_baseline=None,
           paired: bool = False, pairing_note: str = "", B: int = 1000, seed: int = 0, level: float = 0.95,
           fraction: float = 0.1) -> Effect:
    """Score the rollout's predicted change against a baseline and an intervened measurement.

    Args:
        baseline_per_sequence: per-sequence influence ``(S_B, N)`` of the
            baseline model (``influence_per_sequence``), S_B >= 2.
        intervened_per_sequence: the same ``(S_I, N)`` of the intervened model.
        predicted: the rollout's profile ``p_I (N,)`` of the intervened model
            (non-negative, sums to 1).
        predicted_baseline: the rollout's profile ``p_B (N,)`` of the baseline
            model, or None (the predicted change is then taken from the
            measured baseline).
        paired: whether row s of both measurements is the same text (`pairing`
            decides from ``token_ids``); needs S_B = S_I.
        pairing_note: why (or why not) paired, kept in the result.
        B: bootstrap resamples and permutations.
        seed: seed of ``numpy.random.default_rng`` (the prediction's `score`
            uses it too).
        level: the intervals' coverage; the tests' alpha is ``1 - level``.
        fraction: edge fraction of `middle_mass`.

    Returns:
        An `Effect` (the estimators are in the module docstring).

    Raises:
        ValueError: shapes that do not match, negative or non-finite values,
            a profile that does not sum to 1, ``paired`` with S_B != S_I;
            a `ConfigError` (field, value, allowed) for `B`, `level` or
            `fraction` out of range.
    """
    baseline_rows, intervened_rows = check_rows(baseline_per_sequence), check_rows(intervened_per_sequence)
    size = baseline_rows.shape[1]
    if intervened_rows.shape[1] != size:
        raise ValueError(f"intervened_per_sequence: N = {intervened_rows.shape[1]}; allowed: N = {size} "
                         "like the baseline")
    predicted = _check_profile("predicted", predicted, size)
    reference_profile = None if predicted_baseline is None else _check_profile(
        "predicted_baseline", predicted_baseline, size)
    if not (isinstance(B, int) and B >= 2):
        raise ConfigError.of("B", B, "an integer >= 2")
    if not 0 < level < 1:
        raise ConfigError.of("level", level, "0 < level < 1")
    if not 0 < fraction < 0.5:
        raise ConfigError.of("fraction", fraction, "0 < fraction < 0.5")
    if paired and baseline_rows.shape[0] != intervened_rows.shape[0]:
        raise ValueError(f"paired: S = {baseline_rows.shape[0]} and {intervened_rows.shape[0]} sequences; "
                         "allowed: as many intervened as baseline sequences")
    rng = np.random.default_rng(seed)
    measured_baseline = profile_from_rows(np.ones((1, baseline_rows.shape[0])), baseline_rows)[0]
    measured_intervened = profile_from_rows(np.ones((1, intervened_rows.shape[0])), intervened_rows)[0]
    baseline_counts, intervened_counts = _draw_counts(baseline_rows.shape[0], intervened_rows.shape[0], B, paired, rng)
    resampled_baseline = profile_from_rows(baseline_counts, baseline_rows)
    resampled_intervened = profile_from_rows(intervened_counts, intervened_rows)

    effect_w1 = float(wasserstein(measured_intervened, measured_baseline))
    centred = (_inflation(intervened_rows.shape[0]) * (resampled_intervened - measured_intervened)
               - _inflation(baseline_rows.shape[0]) * (resampled_baseline - measured_baseline))
    effect_noise = float(np.median(wasserstein(centred, np.zeros(size))))
    permuted = _permuted_distances(baseline_rows, intervened_rows, paired, B, rng)
    effect_p_value = (1 + int(np.sum(permuted >= effect_w1))) / (B + 1)

    prediction = score(predicted, intervened_rows, B=B, seed=seed, level=level)
    anchored = None if reference_profile is None else score(
        anchored_profile(measured_baseline, reference_profile, predicted), intervened_rows, B=B, seed=seed,
        level=level)

    functions = {"middle_mass": lambda p: middle_mass(p, fraction), "center_of_mass": center_of_mass}
    changes = {}
    for name in CHANGE_METRICS:
        f = functions[name]
        baseline_value, intervened_value = float(f(measured_baseline)), float(f(measured_intervened))
        baseline_draws, intervened_draws = f(resampled_baseline), f(resampled_intervened)
        if reference_profile is None:
            reference, reference_value, reference_draws = "measured baseline", baseline_value, baseline_draws
        else:
            reference, reference_value, reference_draws = "predicted baseline", float(f(reference_profile)), None
        predicted_value = float(f(predicted))
        predicted_draws = None if reference_draws is None else predicted_value - reference_draws
        values = {"measured_baseline": baseline_value, "measured_intervened": intervened_value,
                  "predicted_intervened": predicted_value, "reference_value": reference_value}
        changes[name] = _change(name, values, (intervened_value - baseline_value, intervened_draws - baseline_draws),
                                (predicted_value - reference_value, predicted_draws), reference, level)

    advantage = effect_w1 - prediction.w1
    advantage_draws = (wasserstein(resampled_baseline, resampled_intervened)
                       - wasserstein(predicted, resampled_intervened))
    advantage_interval = bootstrap_interval(advantage, advantage_draws, level, (-1.0, 1.0))
    return Effect(positions=size, sequences_baseline=baseline_rows.shape[0],
                  sequences_intervened=intervened_rows.shape[0], paired=bool(paired),
                  pairing=pairing_note or ("paired" if paired else "unpaired"), effect_w1=effect_w1,
                  effect_noise=effect_noise,
                  effect_ratio=effect_w1 / effect_noise if effect_noise > 0 else (0.0 if effect_w1 == 0 else math.inf),
                  effect_p_value=effect_p_value,
                  effect_test=("sign flip of the per-sequence differences: the two rows of a sequence swapped"
                               if paired else "label permutation of the pooled sequences"),
                  prediction=prediction, anchored=anchored, changes=changes, advantage=float(advantage),
                  advantage_interval=advantage_interval, beats_no_change=bool(advantage_interval[0] > 0),
                  level=level, resamples=B, seed=seed, fraction=fraction)


def write_effect(directory, result: Effect, record: dict, baseline_per_sequence, intervened_per_sequence, predicted,
                 *, predicted_baseline=None, intervention: str = "", model: str = "",
                 predictor: str = "the rollout") -> list:
    """``effect.json`` (`record`: the inputs' names and ``result.as_dict()``) and ``effect.png`` into `directory`.

    The figure (`jaxroll.plot.plot_effect`) draws the measured means
    ``m_B``, ``m_I`` over their pointwise bootstrap bands
    (`jaxroll.measure.uncertainty.profile_band` at the result's level,
    resamples and seed) and the predicted profiles p_I and p_B, on linear and
    log y axes, and the changes: ``m_I - m_B`` over the pointwise band of its
    resamples (drawn as `effect` draws them: shared when paired) and the
    headline ``p_I - p_B``. Legends and title name the `intervention`
    (``tau=0.7``), the `model` and the `predictor`; the title gives the measured effect, the
    prediction's score and the middle mass's changes. Returns the two paths.
    """
    import json
    from pathlib import Path

    from ..plot import plot_effect

    directory = Path(directory)
    (directory / "effect.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    rows = (np.asarray(baseline_per_sequence, np.float64), np.asarray(intervened_per_sequence, np.float64))
    bands = tuple(profile_band(one, level=result.level, resamples=result.resamples, seed=result.seed) for one in rows)
    counts = _draw_counts(rows[0].shape[0], rows[1].shape[0], result.resamples, result.paired,
                          np.random.default_rng(result.seed))
    changes = profile_from_rows(counts[1], rows[1]) - profile_from_rows(counts[0], rows[0])
    change_band = np.quantile(changes, [(1 - result.level) / 2, (1 + result.level) / 2], axis=0)
    baseline, intervened = (one.sum(axis=0) / one.sum() for one in rows)  # m_B, m_I
    figure = plot_effect(directory / "effect.png", baseline, intervened, predicted, bands=bands,
                         change_band=change_band, predicted_baseline=predicted_baseline, name=intervention,
                         sequences=(result.sequences_baseline, result.sequences_intervened), level=result.level,
                         title=_title(result, intervention, model), predictor=predictor)
    return [directory / "effect.json", figure]


def _title(result: Effect, intervention: str, model: str) -> str:
    """The figure's title: what was changed in which model, the effect, the prediction, the middle mass's changes."""
    score, middle, percent = result.prediction, result.changes["middle_mass"], f"{100 * result.level:g}%"
    low, high = middle.measured_interval
    subject = f"the effect of {intervention or 'the intervention'}" + (f" on {model}" if model else "")
    return "\n".join([
        f"{subject}: measured W1/(N-1) = {result.effect_w1:.3g} = {result.effect_ratio:.3g}x the noise of the "
        f"difference, p = {result.effect_p_value:.2g} ({'paired' if result.paired else 'unpaired'})",
        f"prediction: W1/(N-1) = {score.w1:.3g} = {score.ratio:.3g}x the noise, p = {score.p_value:.2g}; "
        f"{'beats' if result.beats_no_change else 'does not beat'} 'no change' (W1/(N-1) = {result.effect_w1:.3g})",
        f"middle mass change: measured {middle.measured:+.3g} [{percent}: {low:+.3g}, {high:+.3g}], "
        f"{result.headline.removeprefix('predicted change = ')} {middle.predicted:+.3g}"])
