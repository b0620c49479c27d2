"""``jaxroll compare``: distances and shape statistics of two profiles, and its figure.

With ``--rows-config CONFIG.yaml`` and one ``--measured DIR`` whose
measurement has rows (``jaxroll measure --queries K``), every measured row is
also scored against the rows of that rollout configuration, as ``jaxroll score
--rows-config`` does (`jaxroll.measure.row_scores.score_measured_rows`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from . import _common


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
    compare.add_argument("--out", type=Path, default=None, metavar="DIR",
                         help=f"draw both profiles on one axis, W1 first in the title, into DIR/{FIGURE}; with "
                              "--rows-config also rows.json, rows.png (default for those: results/compare; created)")
    compare.add_argument("--force", action="store_true", help="replace existing files of --out")
    compare.add_argument("--measured", type=Path, action="append", default=None, metavar="DIR",
                         help="given once: the measurement of A.csv; twice: of A.csv, then of B.csv ('-' for "
                              "none: --measured - --measured DIR measures B only). A.csv (B.csv) must be the "
                              "influence.csv of that measurement (the --out of jaxroll measure, with "
                              "influence_per_sequence): with --out its pointwise 95%% bootstrap band over the "
                              "sequences is drawn; with --rows-config: the measurement whose rows are scored "
                              "(then no band)")
    _common.add_json_argument(compare)
    compare.add_argument("--resamples", type=_common.positive_int, default=1000,
                         help="bootstrap resamples B of a band, and of the rows with --rows-config "
                              "(default 1000)")
    compare.add_argument("--seed", type=_common.non_negative_int, default=0,
                         help="random seed of a band and of the rows' resamples (default 0)")
    _common.add_rows_arguments(compare, "--measured DIR (give one)")
    _common.add_retired_argument(compare, "--plot", "--out DIR (it writes compare.png there)")
    _common.add_retired_argument(compare, "--overwrite", "--force", takes_value=False)
    _common.add_retired_argument(compare, "--rows-out", "--out DIR")
    _common.add_retired_argument(compare, "--measured-a", "--measured DIR (first: A)")
    _common.add_retired_argument(compare, "--measured-b", "--measured DIR (second: B; --measured - --measured DIR "
                                                          "for B only)")
    compare.set_defaults(run=_run_compare)


FIGURE = "compare.png"
"""The figure `jaxroll compare --out DIR` draws: both profiles on one axis, each over its band."""


def _run_compare(arguments) -> None:
    from .. import io, metrics

    if not 0 < arguments.fraction < 0.5:
        raise ConfigError(f"--fraction: got {arguments.fraction}; allowed: 0 < fraction < 0.5")
    measured = _measured_folders(arguments)
    if arguments.resamples < 2:
        raise ConfigError(f"--resamples: got {arguments.resamples}; allowed: >= 2")
    figure = None if arguments.out is None else _common.free_output_path(arguments.out / FIGURE, arguments.force)
    rows_outputs = _common.check_rows_arguments(arguments, arguments.out or Path("results") / "compare")
    rows_of = None
    if rows_outputs is not None:
        from ..measure.outputs import read_measurement

        name, directory = next((name, directory) for name, directory in measured.items() if directory is not None)
        saved = read_measurement(directory, flag="--measured", need_metadata=False)
        saved.query_rows(f"--measured {directory}")
        rows_of = (saved, directory)
    p = io.read_profile(arguments.first)
    q = io.read_profile(arguments.second)
    try:
        result = metrics.compare(p, q, normalize=arguments.normalize, fraction=arguments.fraction)
    except ConfigError as error:
        raise error.renamed(str({"p": arguments.first, "q": arguments.second}.get(error.field, error.field))) \
            from None
    p, q = p / p.sum(), q / q.sum()  # as metrics.compare read them
    # With --rows-config the measurement is the rows' (no band); refusals before anything is printed.
    banded = measured if rows_of is None else {"A": None, "B": None}
    drawn = None if figure is None else _figure_arguments(arguments, banded, p, q, result)
    if arguments.json:
        _common.print_json(_record(arguments, p, q, result))
    else:
        _print_table(arguments, p, q, result)
    if drawn is not None:
        from ..plot import plot_two_profiles

        figure.parent.mkdir(parents=True, exist_ok=True)
        plot_two_profiles(figure, p, q, **drawn)
        if not arguments.json:
            print(f"  wrote {figure}")
    if rows_of is not None:
        from ..measure.row_scores import rows_lines, score_measured_rows

        saved, directory = rows_of
        # The rows' intervals at the bands' coverage.
        _, scores, distance = score_measured_rows(
            saved, directory, f"--measured {directory}", arguments.rows_config, rows_outputs,
            B=arguments.resamples, seed=arguments.seed, level=BAND_LEVEL, buffer=arguments.buffer,
            statistic=arguments.statistic)
        if not arguments.json:
            print("\n".join(rows_lines(scores, distance, rows_outputs)))


def _measured_folders(arguments) -> dict:
    """``{"A": DIR or None, "B": DIR or None}`` of the repeated ``--measured`` (first A, then B; ``-`` none)."""
    given = arguments.measured or []
    if len(given) > 2:
        raise ConfigError(f"--measured: given {len(given)} times; allowed: at most twice (A's, then B's)",
                          field="--measured", value=[str(path) for path in given], allowed="at most twice")
    folders = [None if str(path) == "-" else path for path in given] + [None] * (2 - len(given))
    measured = dict(zip("AB", folders))
    present = [directory for directory in folders if directory is not None]
    if arguments.rows_config is None:
        if present and arguments.out is None:
            raise ConfigError(f"--measured {present[0]}: draws a band in the figure only; pass --out DIR "
                              "(or --rows-config CONFIG.yaml to score its rows)")
    elif len(present) != 1:
        raise ConfigError(f"--rows-config {arguments.rows_config}: scores the rows of one measurement; allowed: "
                          f"exactly one --measured DIR (got {len(present)})")
    return measured


def _record(arguments, p, q, result) -> dict:
    """``--json``: the distances and both shapes; an undefined value (Spearman of a constant, no middle) is null."""
    import numpy as np

    from .. import metrics

    constant = any(np.all(x == x[0]) for x in (p, q))
    k = metrics.edge_count(p.size, arguments.fraction)
    distances = {field: float(getattr(result, field)) for field in ("wasserstein", "spearman", "kl", "js",
                                                                    "total_variation")}
    if constant:
        distances["spearman"] = None
    shapes = {}
    for name, shape in (("A", result.p), ("B", result.q)):
        shapes[name] = {field: float(getattr(shape, field)) for field in metrics.Shape._fields}
        if p.size <= 2 * k:
            shapes[name]["u_index"] = None
    finite = {key: (None if value is not None and not np.isfinite(value) else value)
              for key, value in distances.items()}
    return {"A": str(arguments.first), "B": str(arguments.second), "N": int(p.size),
            "fraction": arguments.fraction, **finite,
            "shape": {name: {key: (None if value is not None and not np.isfinite(value) else value)
                             for key, value in values.items()} for name, values in shapes.items()}}


def _print_table(arguments, p, q, result) -> None:
    import numpy as np

    from .. import metrics

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


BAND_LEVEL = 0.95
"""Coverage of the pointwise bootstrap bands `jaxroll compare --out` draws."""


def _figure_arguments(arguments, measured: dict, p, q, result) -> dict:
    """The figure's labels, bands and title for `plot_two_profiles`: A and B (normalised), each over its
    pointwise band where a ``--measured DIR`` is given for it.

    A band is `jaxroll.measure.uncertainty.profile_band` of the rows
    ``g_s (S, N)`` of the measurement: the 2.5 % and 97.5 % quantiles of each
    position over `--resamples` bootstrap means ``m* = sum_s c_s g_s / sum_{s, j}
    c_s g_s[j]`` (c ~ Multinomial(S, 1/S), seeded by --seed). The CSV must be
    that measurement's mean profile ``m = sum_s g_s / sum_{s, j} g_s[j]`` (max
    |difference| <= 1e-6 max m): a band drawn around another curve would
    claim a spread it does not have.
    """
    import numpy as np

    from ..measure.outputs import read_measurement
    from ..measure.uncertainty import profile_band

    labels, bands, band_labels = [], [], []
    for name, path, profile in (("A", arguments.first, p), ("B", arguments.second, q)):
        directory = measured[name]
        if directory is None:
            labels.append(f"{name}: {path}")
            bands.append(None)
            band_labels.append("")
            continue
        saved = read_measurement(directory, flag="--measured", need_metadata=False)
        rows = saved.influence_rows(f"--measured {directory}", profile.size, path)
        mean = rows.sum(axis=0) / rows.sum()
        gap = float(np.max(np.abs(mean - profile)))
        if gap > 1e-6 * float(mean.max()):
            raise ConfigError(f"--measured {directory}: its mean profile differs from {path} by up to {gap:.3g}; "
                              f"allowed: the influence.csv of that measurement ({name}.csv)")
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
