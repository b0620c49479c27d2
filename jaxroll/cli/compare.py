"""``jaxroll compare``: distances and shape statistics of two profiles, and its figure.

With ``--rows-config CONFIG.yaml`` and one of ``--measured-a`` / ``--measured-b``
whose measurement has rows (``jaxroll measure --queries K``), every measured row
is also scored against the rows of that rollout configuration, as ``jaxroll
score --rows-config`` does (`jaxroll.cli.score.score_measured_rows`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import _common
from .score import add_rows_arguments, check_rows_arguments, measured_rows_arrays, score_measured_rows


def add_parser(commands) -> None:
    compare = commands.add_parser(
        "compare", help="distances and shape statistics of two profiles",
        description="Compare two profile CSVs (header token_position,probability): "
                    "Wasserstein W1/(N-1), Spearman, KL(A||B), Jensen-Shannon, total "
                    "variation, and the shape of each (p[0], p[-1], argmin, center of "
                    "mass, edge and middle mass, U-index).")
    compare.add_argument("first", type=Path, metavar="A.csv", help="profile p")
    compare.add_argument("second", type=Path, metavar="B.csv", help="profile q")
    compare.add_argument("--normalize", action="store_true",
                         help="rescale profiles that do not sum to 1 (default: reject them)")
    compare.add_argument("--fraction", type=float, default=0.1,
                         help="edge fraction for edge mass and U-index (default 0.1)")
    compare.add_argument("--plot", type=Path, metavar="FIGURE.png",
                         help="draw both profiles on one axis, W1 first in the title")
    compare.add_argument("--overwrite", action="store_true", help="replace an existing --plot file (and existing "
                         "rows.json, rows.png in --rows-out)")
    for name, flag in (("A", "--measured-a"), ("B", "--measured-b")):
        compare.add_argument(flag, type=Path, metavar="DIR",
                             help=f"with --plot: {name}.csv is the influence.csv of the measurement in DIR "
                                  "(the --out of jaxroll measure, with influence_per_sequence); draw its "
                                  "pointwise 95%% bootstrap band over the sequences; with --rows-config: the "
                                  "measurement whose rows are scored")
    compare.add_argument("--resamples", type=_common.positive_int, default=1000,
                         help="bootstrap resamples B of a band, and of the rows with --rows-config "
                              "(default 1000)")
    compare.add_argument("--seed", type=_common.non_negative_int, default=0,
                         help="random seed of a band and of the rows' resamples (default 0)")
    add_rows_arguments(compare, "--measured-a or --measured-b DIR (give one)")
    compare.set_defaults(run=_run_compare)


def _run_compare(arguments) -> None:
    import numpy as np

    from .. import io, metrics

    if not 0 < arguments.fraction < 0.5:
        raise ConfigError(f"--fraction: got {arguments.fraction}; allowed: 0 < fraction < 0.5")
    measured = [(flag, value) for flag, value in (("--measured-a", arguments.measured_a),
                                                    ("--measured-b", arguments.measured_b)) if value is not None]
    if arguments.rows_config is None:
        for flag, value in measured:
            if arguments.plot is None:
                raise ConfigError(f"{flag} {value}: draws a band in the figure only; pass --plot FIGURE.png "
                                  "(or --rows-config CONFIG.yaml to score its rows)")
    elif len(measured) != 1:
        raise ConfigError(f"--rows-config {arguments.rows_config}: scores the rows of one measurement; allowed: "
                          f"exactly one of --measured-a DIR, --measured-b DIR (got {len(measured)})")
    if arguments.resamples < 2:
        raise ConfigError(f"--resamples: got {arguments.resamples}; allowed: >= 2")
    _common.check_figure_path(arguments.plot, arguments.overwrite)
    rows_outputs = check_rows_arguments(arguments)
    measured_rows = None if rows_outputs is None else measured_rows_arrays(measured[0][1], measured[0][0])
    p = io.read_profile(arguments.first)
    q = io.read_profile(arguments.second)
    try:
        result = metrics.compare(p, q, normalize=arguments.normalize, fraction=arguments.fraction)
    except ConfigError as error:
        field, _, rest = str(error).partition(":")
        name = {"p": arguments.first, "q": arguments.second}.get(field, field)
        raise ConfigError(f"{name}:{rest}") from None
    p, q = p / p.sum(), q / q.sum()  # as metrics.compare read them
    figure = None if arguments.plot is None else _figure_arguments(arguments, p, q, result)  # refusals first
    k = metrics.edge_count(p.size, arguments.fraction)
    print(f"jaxroll compare: A = {arguments.first}, B = {arguments.second}, N = {p.size}")
    constant = [name for name, x in (("A", p), ("B", q)) if np.all(x == x[0])]
    for field in ("wasserstein", "spearman", "kl", "js", "total_variation"):
        label = {"kl": "kl(A || B)", "wasserstein": "wasserstein W1/(N-1)"}.get(field, field)
        value, note = getattr(result, field), ""
        if field == "spearman" and constant:
            value, note = "undefined", f"({' and '.join(constant)} constant: ranks without spread)"
        elif field == "kl" and value == np.inf:
            note = "(B is 0 where A is not)"
        elif field == "wasserstein" and p.size == 1:
            note = "(one position: no distance to travel)"
        print(f"  {label:22} {_cell(value, 9)} {note}".rstrip())
    print(f"  {'':22} {'A':>14} {'B':>14}")
    for field in metrics.Shape._fields:
        a, b = getattr(result.p, field), getattr(result.q, field)
        note = ""
        if field == "u_index" and p.size <= 2 * k:
            a = b = "undefined"
            note = f"(no middle: N = {p.size} <= 2k, k = {k} edge position{'s' if k > 1 else ''})"
        elif field == "u_index" and np.inf in (a, b):
            note = "(inf: the middle holds no mass)"
        elif field == "center_of_mass" and p.size == 1:
            note = "(one position: defined as 0)"
        print(f"  {field:22} {_cell(a, 6, 14)} {_cell(b, 6, 14)} {note}".rstrip())
    if figure is not None:
        from ..plot import plot_two_profiles

        plot_two_profiles(arguments.plot, p, q, **figure)
        print(f"  wrote {arguments.plot}")
    if measured_rows is not None:
        arguments.level = BAND_LEVEL  # the rows' intervals at the bands' coverage
        score_measured_rows(arguments, measured_rows, measured[0][1], measured[0][0], rows_outputs)


BAND_LEVEL = 0.95
"""Coverage of the pointwise bootstrap bands `jaxroll compare --plot` draws."""


def _figure_arguments(arguments, p, q, result) -> dict:
    """``--plot``'s labels, bands and title for `plot_two_profiles`: A and B (normalised), each over its
    pointwise band where --measured-a / --measured-b is given.

    A band is `jaxroll.measure.uncertainty.profile_band` of the rows
    ``g_s (S, N)`` of the measurement: the 2.5 % and 97.5 % quantiles of each
    position over `--resamples` bootstrap means ``m* = sum_s c_s g_s / sum_{s, j}
    c_s g_s[j]`` (c ~ Multinomial(S, 1/S), seeded by --seed). The CSV must be
    that measurement's mean profile ``m = sum_s g_s / sum_{s, j} g_s[j]`` (max
    |difference| <= 1e-6 max m): a band drawn around another curve would
    claim a spread it does not have.
    """
    import numpy as np

    from ..measure.uncertainty import profile_band

    labels, bands, band_labels = [], [], []
    for name, path, flag, directory, profile in (
            ("A", arguments.first, "--measured-a", arguments.measured_a, p),
            ("B", arguments.second, "--measured-b", arguments.measured_b, q)):
        if directory is None:
            labels.append(f"{name}: {path}")
            bands.append(None)
            band_labels.append("")
            continue
        rows = _common.measured_rows(directory, flag, profile.size, path)
        mean = rows.sum(axis=0) / rows.sum()
        gap = float(np.max(np.abs(mean - profile)))
        if gap > 1e-6 * float(mean.max()):
            raise ConfigError(f"{flag} {directory}: its mean profile differs from {path} by up to {gap:.3g}; "
                              "allowed: the influence.csv of that measurement")
        bands.append(profile_band(rows, level=BAND_LEVEL, resamples=arguments.resamples, seed=arguments.seed))
        sequences = rows.shape[0]
        labels.append(f"{name}: {path}, measured mean of {sequences} sequences")
        band_labels.append(f"{name}: pointwise {100 * BAND_LEVEL:g}% bootstrap band ({arguments.resamples} "
                           f"resamples of the {sequences} sequences, seed {arguments.seed})")
    constant = any(np.all(x == x[0]) for x in (p, q))
    spearman = "undefined" if constant else f"{float(result.spearman):.3g}"
    title = (f"W1/(N-1) = {float(result.wasserstein):.3g}, KL(A || B) = {float(result.kl):.3g}, "
             f"Spearman = {spearman}, N = {p.size}\nA (blue) = {arguments.first}, B (red) = {arguments.second}")
    return {"labels": tuple(labels), "bands": tuple(bands), "band_labels": tuple(band_labels),
            "level": BAND_LEVEL, "title": title}


def _cell(value, digits: int, width: int = 0) -> str:
    """A number with `digits` significant digits, or a word, right-aligned to `width`."""
    text = value if isinstance(value, str) else f"{value:.{digits}g}"
    return f"{text:>{width}}"
