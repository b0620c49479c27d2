"""The kinetic closed form beside the matching rollout (`jaxroll kinetic`)."""

from __future__ import annotations

import numpy as np

from ._canvas import POSITION_LABEL, _figure


def kinetic_figure(distribution, rollout, fine, mode, s_rollout, scaled, *, title: str = ""):
    """The kinetic profile against the rollout that matches it, in two panels.

    Left: the kinetic distribution and the rollout profile over positions
    j < N-1 (each renormalised there; the query's point mass has no kinetic
    counterpart). Right: the bridge, the mode ``g(c; s)`` on the grid `fine`
    against ``N e^c P_T[N-1, j]`` at ``s = j/N`` (`s_rollout`, `scaled`), on
    a log axis.
    """
    figure, ((left, right),) = _figure(12, 4.4, 2, layout="tight")
    positions = np.arange(np.size(distribution))
    left.plot(positions, distribution, color="C0", label="kinetic S_t(s_j), s_j = (j + 1/2)/N, all modes")
    left.plot(positions, rollout, color="C1", label="matching rollout p_T(j), one rate c = a_eff t")
    left.set_xlabel(POSITION_LABEL)
    left.set_ylabel("probability (influence on the last position)")
    left.set_ylim(bottom=0.0)
    left.legend(fontsize=8)
    left.set_title("both profiles over j < N-1, each renormalised (query point mass left out)", fontsize=9)
    right.plot(fine, mode, color="C0", label="kinetic mode g(c; s), one rate")
    right.plot(s_rollout, scaled, ".", color="C1", markersize=2.5, label="rollout N e^c P_T[N-1, j], s = j/N")
    right.set_xlabel("relative position s")
    right.set_ylabel("g(c; s)")
    right.set_yscale("log")
    right.legend(fontsize=8)
    right.set_title("the bridge: a single mode and the rollout on the kinetic scale", fontsize=9)
    figure.suptitle(title, fontsize=9)
    return figure
