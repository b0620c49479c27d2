"""Figures. Matplotlib with the Agg backend: files, never a window.

Influence profiles are drawn on linear axes, where the U-shape of the paper
(primacy and recency, the lost middle) is visible; quantities that span many
orders of magnitude (the attention-only collapse, the causal-masking rung of
the forces ladder) get a log-scaled panel of their own.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

POSITION_LABEL = "input position j (0 = first token)"
INFLUENCE_LABEL = "influence on the last position, p_T(j)"


def _tenths(axes, n: int) -> None:
    """Shade the first, middle and last tenth of positions (as `metrics.edge_mass`)."""
    k = max(1, round(0.1 * n))
    start = (n - k) // 2
    for low, label in ((0, "first / middle / last tenth"), (start, None), (n - k, None)):
        axes.axvspan(low - 0.5, low + k - 0.5, color="0.85", zorder=0, label=label)


def _profile_panel(axes, profile, *, label: str, color: str = "C0") -> None:
    """A profile on linear axes, its minimum marked and its tenths shaded."""
    positions = np.arange(profile.size)
    _tenths(axes, profile.size)
    axes.plot(positions, profile, color=color, label=label)
    lowest = int(np.argmin(profile))
    axes.plot([lowest], [profile[lowest]], "o", color="k",
              label=f"minimum at j = {lowest} ({profile[lowest]:.3g})")
    axes.set_xlim(-0.5, profile.size - 0.5)
    axes.set_ylim(bottom=0.0)
    axes.set_xlabel(POSITION_LABEL)
    axes.set_ylabel(INFLUENCE_LABEL)


def _positive_floor(*arrays) -> float:
    values = np.concatenate([np.ravel(a) for a in arrays])
    values = values[values > 0]
    return float(values.min()) if values.size else 1e-300


def plot_profile(path, profile, attention_only=None, *, title: str = "") -> Path:
    """The influence profile on linear axes; the attention-only contrast beside it on a log axis.

    Left: ``p_T(j)`` against position, the minimum marked, the first, middle
    and last tenth shaded (the masses the summary prints). Right, when
    `attention_only` (the ``lambda = 1`` profile of the same kernels) is given:
    both profiles on a log axis, where the collapse onto token 0 that
    residuals prevent is visible.
    """
    profile = np.asarray(profile, dtype=np.float64)
    panels = 1 if attention_only is None else 2
    figure, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), constrained_layout=True,
                                squeeze=False)
    _profile_panel(axes[0, 0], profile, label="residual-aware rollout")
    axes[0, 0].set_title("residual-aware rollout (linear axes)")
    axes[0, 0].legend(fontsize=8)
    if attention_only is not None:
        attention_only = np.asarray(attention_only, dtype=np.float64)
        contrast = axes[0, 1]
        positions = np.arange(profile.size)
        # Zeros (float32 underflow) have no place on a log axis: draw them at the floor.
        floor = _positive_floor(profile, attention_only) / 10
        contrast.plot(positions, np.maximum(profile, floor), color="C0", label="residual-aware rollout")
        contrast.plot(positions, np.maximum(attention_only, floor), color="C3", linestyle="--",
                      label=f"attention only (lambda = 1): p[0] = {attention_only[0]:.4f}")
        contrast.set_yscale("log")
        contrast.set_xlim(-0.5, profile.size - 0.5)
        contrast.set_xlabel(POSITION_LABEL)
        contrast.set_ylabel(f"{INFLUENCE_LABEL} (log)")
        contrast.set_title("contrast: the attention-only collapse")
        contrast.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_forces(path, profiles, names, *, title: str = "") -> Path:
    """The rungs of `jaxroll.theory.forces`, each labelled by the force it adds.

    `profiles` is ``(K, n)`` (causal masking alone, + residual, + ALiBi,
    + content). Left: the residual-aware rungs on linear axes (the shape each
    force gives). Right: every rung on a log axis, since causal masking alone
    puts nearly all mass on token 0.
    """
    profiles = np.asarray(profiles, dtype=np.float64)
    positions = np.arange(profiles.shape[-1])
    labels = ["causal masking alone"] + [f"+ {name}" for name in names[1:]]
    figure, (linear, logarithmic) = plt.subplots(1, 2, figsize=(13, 4.2), constrained_layout=True)
    _tenths(linear, profiles.shape[-1])
    floor = _positive_floor(profiles[1:]) / 10
    for k, (profile, label) in enumerate(zip(profiles, labels)):
        style = "-" if k == len(labels) - 1 else "--"
        if k > 0:
            linear.plot(positions, profile, color=f"C{k}", linestyle=style, label=label)
        logarithmic.plot(positions, np.maximum(profile, floor), color=f"C{k}", linestyle=style, label=label)
    # Scale to the full model (the last rung): an earlier rung's spike at
    # token 0 would flatten the shape that matters.
    top = 1.25 * float(profiles[-1].max())
    clipped = bool(profiles[1:].max() > top)
    linear.set_ylim(0.0, top)
    linear.set_title("residual-aware rungs (linear axes" + (", peaks clipped)" if clipped else ")"))
    logarithmic.set_yscale("log")
    # Causal masking alone leaves later tokens ~1e-300: scale the axis to the
    # residual-aware rungs, so their shapes stay visible.
    logarithmic.set_ylim(bottom=floor, top=1.5)
    logarithmic.set_title("every rung (log axis)")
    for axes in (linear, logarithmic):
        axes.set_xlim(-0.5, profiles.shape[-1] - 0.5)
        axes.set_xlabel(POSITION_LABEL)
        axes.set_ylabel(INFLUENCE_LABEL)
        axes.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_fit(path, target, initial, fitted, losses=None, *, title: str = "") -> Path:
    """A fit: target, initial and fitted profiles on linear axes; the loss curve beside.

    The loss panel shows the loss before each optimisation step of
    `jaxroll.fit` (``FitResult.losses``), on a log scale when positive.
    """
    target, initial, fitted = (np.asarray(x, dtype=np.float64) for x in (target, initial, fitted))
    positions = np.arange(target.size)
    panels = 2 if losses is not None and len(losses) else 1
    figure, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), constrained_layout=True,
                                squeeze=False)
    profile_axes = axes[0, 0]
    _tenths(profile_axes, target.size)
    profile_axes.plot(positions, target, color="k", linewidth=2, label="target")
    profile_axes.plot(positions, initial, color="C3", linestyle="--", label="initial")
    profile_axes.plot(positions, fitted, color="C0", label="fitted")
    profile_axes.set_xlim(-0.5, target.size - 0.5)
    profile_axes.set_ylim(bottom=0.0)
    profile_axes.set_xlabel(POSITION_LABEL)
    profile_axes.set_ylabel(INFLUENCE_LABEL)
    profile_axes.set_title("profiles (linear axes)")
    profile_axes.legend(fontsize=8)
    if panels == 2:
        losses = np.asarray(losses, dtype=np.float64)
        loss_axes = axes[0, 1]
        loss_axes.plot(np.arange(losses.size), losses, color="C0")
        if np.all(losses > 0):
            loss_axes.set_yscale("log")
        loss_axes.set_xlabel("optimisation step")
        loss_axes.set_ylabel("loss")
        loss_axes.set_title("optimisation")
    figure.suptitle(title, fontsize=10)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_lambdas(path, lambdas, spread=None, *, title: str = "") -> Path:
    """Measured mixing coefficients ``lambda_t`` against layer, with their spread across sequences."""
    lambdas = np.asarray(lambdas, dtype=np.float64)
    layers = np.arange(1, lambdas.size + 1)
    figure, axes = plt.subplots(figsize=(7, 4), constrained_layout=True)
    axes.errorbar(layers, lambdas, yerr=spread, marker="o", capsize=3,
                  label="mean over sequences" + ("; bars: one standard deviation" if spread is not None else ""))
    axes.set_xlabel("layer t (1 = first)")
    axes.set_ylabel("lambda_t = ||a|| / (||x|| + ||a||) (dimensionless)")
    top = lambdas if spread is None else lambdas + np.asarray(spread)
    axes.set_ylim(0.0, max(1e-3, float(np.max(top))) * 1.1)
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_measured_influence(path, influence, *, title: str = "") -> Path:
    """Measured gradient influence ``||df / de_j||`` (normalised to sum 1) on linear axes."""
    influence = np.asarray(influence, dtype=np.float64)
    figure, axes = plt.subplots(figsize=(7, 4.2), constrained_layout=True)
    _profile_panel(axes, influence, label="measured gradient influence")
    axes.set_ylabel("normalised ||df / de_j|| (sums to 1)")
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)


def plot_sweep(directory, statistics, axes, *, title: str = "") -> list[Path]:
    """One figure per shape statistic of a sweep: ``heatmap_<name>.png`` or ``line_<name>.png``.

    `statistics` maps a name to an array over the grid ``(len(axes[0][1]), ...)``;
    `axes` lists ``(axis name, tick values)``. Two or more axes: a heatmap over
    the first two, the others held at their first value (said in the title);
    one axis: a line plot. Each file is written to a temporary name and
    renamed, so no half-written figure is left behind.
    """
    import os

    directory = Path(directory)
    written = []
    held = ", ".join(f"{name} = {values[0]}" for name, values in axes[2:])
    for name, values in statistics.items():
        values = np.asarray(values, dtype=np.float64)
        values = values[(slice(None),) * min(2, values.ndim) + (0,) * max(0, values.ndim - 2)]
        figure, axes_ = plt.subplots(figsize=(6, 4.5), constrained_layout=True)
        if values.ndim == 0 or len(axes) == 0:
            plt.close(figure)
            continue
        if values.ndim == 1:
            (axis_name, ticks), = axes[:1]
            axes_.plot(np.arange(len(ticks)), values, "o-", color="C0")
            axes_.set_xticks(np.arange(len(ticks)), [_tick(t) for t in ticks], rotation=45)
            axes_.set_xlabel(axis_name)
            axes_.set_ylabel(name)
            path = directory / f"line_{name}.png"
        else:
            (row_name, rows), (column_name, columns) = axes[:2]
            image = axes_.imshow(values, origin="lower", aspect="auto", cmap="viridis")
            axes_.set_yticks(np.arange(len(rows)), [_tick(t) for t in rows])
            axes_.set_xticks(np.arange(len(columns)), [_tick(t) for t in columns], rotation=45)
            axes_.set_ylabel(row_name)
            axes_.set_xlabel(column_name)
            figure.colorbar(image, ax=axes_, label=name)
            path = directory / f"heatmap_{name}.png"
        axes_.set_title(f"{title}\n{name}" + (f" ({held})" if held else ""), fontsize=9)
        temporary = path.with_name(path.name + ".tmp")
        figure.savefig(temporary, dpi=100, format="png")
        plt.close(figure)
        os.replace(temporary, path)
        written.append(path)
    return written


def _tick(value) -> str:
    return f"{value:.3g}" if isinstance(value, (float, np.floating)) else str(value)
