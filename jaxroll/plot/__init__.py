"""Every figure of jaxroll, pyplot-free: a `matplotlib.figure.Figure` on an Agg canvas, files, never a window.

One module per subject builds its figures (the ``*_figure`` functions,
pure: data in, a `Figure` out): `profile` (a rollout and its attention-only
contrast), `forces` (the forces ladder), `fit` (a fit and its loss curve),
`measured` (lambdas, measured influence, two profiles with bands), `sweep`
(lines and heatmaps of a sweep), `task` (task accuracy by depth, a task
curve beside the prediction), `task_table` (an external accuracy table
beside the prediction) and `kinetic` (the kinetic closed form beside
its rollout), `effect` (a predicted change against two
measurements), `series` (a measurement over training steps); `_canvas`
holds the axes they share. The ``plot_*`` functions
here write one of them to a file, all through `_save`, so that one wrapper
of ``jaxroll.plot._save`` (as the tests use) sees every figure written.

``import jaxroll`` does not import this package (it loads matplotlib): the
commands import it when they draw.
"""

from __future__ import annotations

from pathlib import Path

# Every figure and the canvas's constants, re-exported without an __all__ (an
# __all__ would ask for an API page of its own, scripts/check_api_docs.py), with the private
# helpers the tests use; _save is the one writer every plot_* below goes through.
from ._canvas import FLOOR_DECADES, INFLUENCE_LABEL, POSITION_LABEL, _figure, _log_axis, _log_floor, _save
from .design import design_figure
from .effect import effect_figure
from .fit import CLIP_FACTOR, fit_figure
from .forces import COINCIDE, FORCE_LABELS, RUNG_STYLES, forces_figure
from .interventions import interventions_figure
from .kinetic import kinetic_figure
from .measured import lambdas_figure, measured_influence_figure, two_profiles_figure
from .profile import COLLAPSE_THRESHOLD, collapsed, intervened_profile_figure, profile_figure
from .series import series_figure
from .sweep import sweep_figures
from .task import SCORE_LABELS, task_accuracy_figure, task_comparison_figure
from .task_table import accuracy_table_figure


def plot_profile(path, profile, attention_only=None, *, title: str = "", attention_only_model: bool = False) -> Path:
    """`profile_figure` (the influence profile; the attention-only contrast beside it), written to `path`."""
    return _save(profile_figure(profile, attention_only, title=title,
                                attention_only_model=attention_only_model), path)


def plot_intervened_profile(path, baseline, changed, *, change: str, title: str = "") -> Path:
    """`intervened_profile_figure` (baseline and changed profiles, their difference), written to `path`."""
    return _save(intervened_profile_figure(baseline, changed, change=change, title=title), path)


def plot_forces(path, profiles, names, *, title: str = "") -> Path:
    """`forces_figure` (the rungs of `jaxroll.theory.forces`), written to `path`."""
    return _save(forces_figure(profiles, names, title=title), path)


def plot_fit(path, target, initial, fitted, losses=None, *, initial_loss: float | None = None,
             title: str = "") -> Path:
    """`fit_figure` (target, initial and fitted profiles; the loss curve beside), written to `path`."""
    return _save(fit_figure(target, initial, fitted, losses, initial_loss=initial_loss, title=title), path)


def plot_lambdas(path, lambdas, spread=None, *, title: str = "") -> Path:
    """`lambdas_figure` (measured ``lambda_t`` by layer, their spread across sequences), written to `path`."""
    return _save(lambdas_figure(lambdas, spread, title=title), path)


def plot_measured_influence(path, influence, *, title: str = "", band=None, level: float = 0.95) -> Path:
    """`measured_influence_figure` (measured gradient influence, its bootstrap band), written to `path`."""
    return _save(measured_influence_figure(influence, title=title, band=band, level=level), path)


def plot_two_profiles(path, first, second, *, labels: tuple[str, str], bands=(None, None),
                      band_labels: tuple[str, str] = ("", ""), level: float = 0.95, title: str = "") -> Path:
    """`two_profiles_figure` (two profiles on one axis, each over its band), written to `path`.

    `jaxroll compare --out DIR` (compare.png) and, through `plot_prediction_against_measurement`,
    `jaxroll score --out DIR` (score.png).
    """
    return _save(two_profiles_figure(first, second, labels=labels, bands=bands, band_labels=band_labels,
                                     level=level, title=title), path)


def plot_prediction_against_measurement(path, measured, predicted, *, band=None, level: float = 0.95,
                                        title: str = "") -> Path:
    """A predicted profile over the measured one and its pointwise band (`jaxroll score --out DIR`: score.png)."""
    return plot_two_profiles(path, measured, predicted, bands=(band, None), level=level, title=title,
                             labels=("measured gradient influence (mean over sequences)", "prediction"))


def plot_sweep(directory, statistics, axes, *, title: str = "", sequence_length: int | None = None,
               base: dict | None = None) -> list[Path]:
    """`sweep_figures` (one per shape statistic: ``heatmap_<name>.png`` or ``line_<name>.png``), written
    into `directory`.

    Each file is written to a temporary name and renamed, so no half-written
    figure is left behind.
    """
    directory = Path(directory)
    return [_save(figure, directory / name)
            for name, figure in sweep_figures(statistics, axes, title=title, sequence_length=sequence_length,
                                              base=base).items()]


def plot_task_accuracy(path, table, task: str, *, threshold: float, level: float, title: str = "") -> Path:
    """`task_accuracy_figure` (exact match by depth and length), written to `path`."""
    return _save(task_accuracy_figure(table, task, threshold=threshold, level=level, title=title), path)


def plot_task_comparison(path, result, *, level: float, title: str = "") -> Path:
    """`task_comparison_figure` (a task curve beside the predicted influence), written to `path`."""
    return _save(task_comparison_figure(result, level=level, title=title), path)


def plot_accuracy_table(path, result, *, level: float, title: str = "") -> Path:
    """`accuracy_table_figure` (an external accuracy table beside the rollout's prediction), written to `path`."""
    return _save(accuracy_table_figure(result, level=level, title=title), path)


def plot_kinetic(path, distribution, rollout, fine, mode, s_rollout, scaled, *, title: str = "") -> Path:
    """`kinetic_figure` (the kinetic profile beside the matching rollout), written to `path`."""
    return _save(kinetic_figure(distribution, rollout, fine, mode, s_rollout, scaled, title=title), path)


def plot_interventions(path, baseline, changed: dict, *, title: str = "") -> Path:
    """`interventions_figure` written to `path` (PNG)."""
    return _save(interventions_figure(baseline, changed, title=title), path)


def plot_design(path, before, after, target=None, *, fraction: float = 0.1, title: str = "", designed=None,
                kl=None, kl_budget=None) -> Path:
    """`design_figure` (profiles before and after a design, its target, the designed values) written to `path`."""
    return _save(design_figure(before, after, target, fraction=fraction, title=title, designed=designed, kl=kl,
                               kl_budget=kl_budget), path)


def plot_effect(path, baseline, intervened, predicted, **options) -> Path:
    """`effect_figure` (baseline and intervened measurements, the predicted change; its keyword `options`),
    written to `path`."""
    return _save(effect_figure(baseline, intervened, predicted, **options), path)


def plot_series(path, steps, measured, lambdas, w1_over_noise, *, title: str = "") -> Path:
    """`series_figure` (the measured profile, lambda_t and W1 / noise over training steps), written to `path`."""
    return _save(series_figure(steps, measured, lambdas, w1_over_noise, title=title), path)
