"""The figure of ``jaxroll compare-task --accuracy``: an external accuracy table beside the rollout's prediction."""

from __future__ import annotations

import numpy as np

from ._canvas import _figure


def accuracy_table_figure(result, *, level: float, title: str = ""):
    """Accuracy by depth, one panel per setting: measured (with its `level` Wilson interval) and predicted.

    The x axis is the gold span's midpoint as a fraction of the context; the
    prediction is the link of the span's influence mass (solid line on the
    settings the link was fitted on, dashed on the held-out ones); floor and
    ceiling are dotted. Each panel's title says whether the setting was
    fitted or held out, with its Spearman rho and error in accuracy units.
    `result`: a `jaxroll.task.external.TableComparison`.
    """
    rows = result.rows()
    names = result.table.setting_names()
    figure, axes = _figure(3.6 * len(names) + 0.6, 4.4, len(names), layout="constrained")
    for index, (name, panel) in enumerate(zip(names, axes[0])):
        mine = sorted((row for row in rows if row["setting"] == name), key=lambda row: row["depth_fraction"])
        depth = np.array([row["depth_fraction"] for row in mine])
        measured = np.array([row["accuracy"] for row in mine])
        error = np.clip(np.stack([measured - [row["low"] for row in mine],
                                  np.array([row["high"] for row in mine]) - measured]), 0, None)
        fitted = mine[0]["role"] == "fit"
        panel.errorbar(depth, measured, yerr=error, marker="o", capsize=3, color="C0", linestyle="none",
                       label=f"measured ({level:.0%} Wilson interval)")
        panel.plot(depth, [row["predicted"] for row in mine], marker="x", color="C3",
                   linestyle="-" if fitted else "--", label="predicted: link(span mass)")
        for key, style in (("floor", ":"), ("ceiling", "-.")):
            panel.axhline(np.mean([row[key] for row in mine]), color="0.5", linestyle=style, linewidth=1,
                          label=f"{key} (mean)")
        score = result.scores.get(name if not fitted else "fitted") or result.scores.get("held out")
        rho = score["spearman"]
        panel.set_title(f"{name}: {'fit' if fitted else 'held out'} (L = {mine[0]['length']})\n"
                        + (f"Spearman {rho:.2f}, " if np.isfinite(rho) else "") + f"RMSE {score['rmse']:.3f}",
                        fontsize=9)
        panel.set_xlabel("gold span midpoint / context length")
        panel.set_ylim(-0.02, 1.02)
        if index == 0:
            panel.set_ylabel("accuracy")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, fontsize=8, loc="outside lower center", ncols=4)
    import textwrap

    # One --measured per length names several folders: wrap rather than cut the title at the figure's edge.
    figure.suptitle(textwrap.fill(title or f"accuracy by depth: measured vs predicted from the span mass "
                                           f"({result.source}); link fitted on {', '.join(result.fit_settings)}",
                                  110), fontsize=10)
    return figure
