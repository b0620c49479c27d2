"""Figures. Matplotlib with the Agg backend: files, never a window."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_profile(path, profile, attention_only=None, *, title: str = "") -> Path:
    """The influence profile against position, its minimum marked.

    `attention_only` (the lambda = 1 profile of the same kernels) is drawn
    dashed beside it, for contrast: the collapse that residuals prevent.
    """
    profile = np.asarray(profile, dtype=np.float64)
    positions = np.arange(profile.size)
    figure, axes = plt.subplots(figsize=(7, 4), constrained_layout=True)
    axes.plot(positions, profile, color="C0", label="residual-aware rollout")
    if attention_only is not None:
        axes.plot(positions, np.asarray(attention_only), color="C3", linestyle="--",
                  label="attention only (lambda = 1)")
    lowest = int(np.argmin(profile))
    axes.plot([lowest], [profile[lowest]], "o", color="k", label=f"minimum at {lowest}")
    axes.set_yscale("log")
    axes.set_xlabel("input position j")
    axes.set_ylabel("influence on the last position, p_T(j)")
    axes.set_title(title)
    axes.legend()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)


def plot_forces(path, profiles, names, *, title: str = "") -> Path:
    """The four rungs of `jaxroll.theory.forces` overlaid, each labelled by the force it adds.

    `profiles` is ``(4, n)`` (causal, + residual, + ALiBi, + content); log scale,
    since causal masking alone puts nearly all mass on token 0.
    """
    profiles = np.asarray(profiles, dtype=np.float64)
    positions = np.arange(profiles.shape[-1])
    figure, axes = plt.subplots(figsize=(7, 4), constrained_layout=True)
    labels = ["causal masking alone"] + [f"+ {name}" for name in names[1:]]
    for k, (profile, label) in enumerate(zip(profiles, labels)):
        axes.plot(positions, np.maximum(profile, 1e-300), color=f"C{k}",
                  linestyle="-" if k == len(labels) - 1 else "--", label=label)
    axes.set_yscale("log")
    # Causal masking alone leaves later tokens ~1e-300: scale the axis to the
    # residual-aware rungs instead, so their shapes stay visible.
    others = profiles[1:][profiles[1:] > 0]
    if others.size:
        axes.set_ylim(bottom=max(others.min() / 10, 1e-300), top=1.5)
    axes.set_xlabel("input position j")
    axes.set_ylabel("influence on the last position, p_T(j)")
    axes.set_title(title, fontsize=10)
    axes.legend()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)


def plot_fit(path, target, initial, fitted, losses=None, *, title: str = "") -> Path:
    """A fit: target, initial and fitted profiles against position; the loss curve beside.

    The profiles panel uses a log scale (influence spans orders of
    magnitude); the loss panel shows the loss before each optimisation step
    of `jaxroll.fit` (``FitResult.losses``), on a log scale when positive.
    """
    target, initial, fitted = (np.asarray(x, dtype=np.float64) for x in (target, initial, fitted))
    positions = np.arange(target.size)
    panels = 2 if losses is not None and len(losses) else 1
    figure, axes = plt.subplots(1, panels, figsize=(6 * panels + 1, 4), constrained_layout=True,
                                squeeze=False)
    profile_axes = axes[0, 0]
    profile_axes.plot(positions, target, color="k", linewidth=2, label="target")
    profile_axes.plot(positions, initial, color="C3", linestyle="--", label="initial")
    profile_axes.plot(positions, fitted, color="C0", label="fitted")
    profile_axes.set_yscale("log")
    profile_axes.set_xlabel("input position j")
    profile_axes.set_ylabel("influence on the last position, p_T(j)")
    profile_axes.legend()
    profile_axes.set_title(title)
    if panels == 2:
        losses = np.asarray(losses, dtype=np.float64)
        loss_axes = axes[0, 1]
        loss_axes.plot(np.arange(losses.size), losses, color="C0")
        if np.all(losses > 0):
            loss_axes.set_yscale("log")
        loss_axes.set_xlabel("step")
        loss_axes.set_ylabel("loss")
        loss_axes.set_title("optimisation")
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)
