"""The statistics `jaxroll.measure.measure` can compute, by name: the registry.

The built-in statistics (``lambda, content, influence, attention, qk``) are
computed by the pass itself; further ones are `Statistic` records that their
own modules register on import (`jaxroll.measure.sinks`,
`jaxroll.measure.refinements`). The registry lives below them: it imports
none of them at module level, and loads the modules named in
`STATISTIC_MODULES` the first time a query needs the full list, so every
caller sees every statistic whichever module it imported first.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from ..errors import ConfigError

STATISTIC_MODULES = ("jaxroll.measure.sinks", "jaxroll.measure.refinements", "jaxroll.measure.offsets",
                     "jaxroll.measure.sequence_rollout", "jaxroll.measure.path_stats", "jaxroll.measure.gain_rows",
                     "jaxroll.measure.distance_rows")
"""Modules whose import registers statistics (loaded on the first query)."""

BUILTIN_STATS = ("lambda", "content", "influence", "attention", "qk")
"""What `measure` measures itself (``--stats``): lambda_t, content scores, gradient influence, mean attention, mean q.k.

`statistic_names` adds the registered statistics to these."""
DEFAULT_STATS = ("lambda", "content", "influence")
"""The statistics every default starts from (ALiBi models measure exactly these; see `default_stats`)."""
HOOK_KINDS = ("block_input", "attention_output", "query_key", "probabilities")
# Statistics that read q.k before the position encoding: meaningless under rotary.
_NEEDS_RAW_QK = ("content", "qk")


@dataclasses.dataclass(frozen=True)
class Statistic:
    """A statistic beside the built-in ones, computed from the same hooked pass.

    How to add one (e.g. in a new module ``jaxroll/measure/refinements.py``)::

        register_statistic(Statistic(
            name="mine", hooks=("probabilities",),
            allocate=lambda shape: {"mine_sum": np.zeros((shape.layers, shape.length))},
            observe=lambda state, kind, layer, *tensors: ...,   # per layer, per sequence
            accumulate=lambda sums, state, index: ...,          # add the sequence to the sums
            finish=lambda sums, count, shape: {"mine": sums["mine_sum"] / count}))

    at the bottom of its module, and add the module to `STATISTIC_MODULES`
    so that the registry loads it whenever the names are asked for. Sums are float64 arrays added over sequences (merged
    across ranks by addition); arrays named in `per_sequence` have a first
    axis of length S and are merged by row. `finish` returns the arrays that
    go into ``measurement.npz`` (and `Measurement.extra`).

    Attributes:
        name: the ``--stats`` name.
        hooks: which of ``block_input (x)``, ``attention_output (a)``,
            ``query_key (q, k)``, ``probabilities (p)`` it reads; `observe`
            gets ``(state, kind, layer, *tensors)`` with tensors as the hooks
            deliver them (``(1, N, D)``, ``(1, N, H, d)``, ``(1, H, N, N)``).
        allocate: ``shape -> {name: zeros}``; `shape` is a `Shapes`.
        observe, accumulate, finish: see above; `state` is a dict emptied
            before every sequence.
        per_sequence: names of sums indexed by sequence (merged by row).
        positions: the position encodings it supports (``alibi, rope, learned``).
        needs_eager: it reads attention probabilities (eager attention only).
        memory: ``shape -> bytes`` of its float64 sums (checked before loading).
        summary: ``(outputs) -> str``, one line for the command's summary.
        attach: ``(resolved, deliver, recording) -> handles``: hooks of its own
            (modules beyond the four kinds above, or gradients), registered for
            the run and removed after; they call ``deliver(kind, layer,
            *tensors)`` (-> `observe`) and check ``recording()`` in forward hooks.
        requires: other statistics it needs in the same run (e.g. the
            influence backward pass).
        observe_rows: ``(state, layer, start, rows)``, optional: the
            probabilities of one sequence's query rows ``start ..``,
            ``(1, H, c, N)`` float64, chunk by chunk in order, recomputed from
            q and k (`jaxroll.measure.attention_rows`) on an efficient
            attention, and on an eager one wherever the family's logit is
            stated exactly (`attention_rows.recomputable`). `rows` is
            overwritten by the next chunk: sum it, or copy what is kept.
        batch_rows: `observe` and `observe_rows` get the whole batch's
            tensors (``(B, ...)``, ``(B, H, c, N)``) with one state for the
            batch, and `accumulate` is called once per batch with `index` the
            batch's sequence indices (an array): for sums too large to hold
            once per sequence of a batch (`jaxroll.measure.gain_rows`). A
            statistic that reads probabilities and has it runs without eager
            attention; its `attach`, if any, is then called with
            ``recomputed=True`` and must not hook probabilities.
    """

    name: str
    hooks: tuple
    allocate: Callable
    observe: Callable
    accumulate: Callable
    finish: Callable
    per_sequence: tuple = ()
    positions: tuple = ("alibi", "rope", "learned")
    needs_eager: bool = False
    memory: Callable | None = None
    summary: Callable | None = None
    attach: Callable | None = None
    requires: tuple = ()
    observe_rows: Callable | None = None
    batch_rows: bool = False


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Sizes a statistic allocates for: S sequences, L layers, H heads, N tokens."""

    sequences: int
    layers: int
    heads: int
    length: int


_REGISTRY: dict[str, Statistic] = {}
_LOADED = False


def registered() -> dict[str, Statistic]:
    """The registered statistics by name, with every module in `STATISTIC_MODULES` imported."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for module in STATISTIC_MODULES:
            importlib.import_module(module)
    return _REGISTRY


def register_statistic(statistic: Statistic) -> None:
    """Add `statistic` to the names `measure` (and ``--stats``) accept."""
    if statistic.name in BUILTIN_STATS:
        raise ConfigError(f"statistic {statistic.name!r}: a built-in name; allowed: a new name")
    unknown = [kind for kind in statistic.hooks if kind not in HOOK_KINDS]
    if unknown:
        raise ConfigError(f"statistic {statistic.name!r}: hook {unknown[0]!r}; allowed: {', '.join(HOOK_KINDS)}")
    _REGISTRY[statistic.name] = statistic


def statistic_names() -> tuple[str, ...]:
    """Every name ``stats`` accepts: the built-in ones, then the registered ones."""
    return BUILTIN_STATS + tuple(registered())


DENSE_DEFAULT_BYTES = 64 * 2**20
"""The line between the dense and the offset default: ``8 L N^2`` bytes of float64 mean attention.

Below it a model without ALiBi measures the dense mean ``attention`` by
default (its config a `DenseKernel`, the measured kernel exactly), above it
``attention_offsets`` (``O(L H N)``, a `TableKernel`). 64 MiB is where the
dense kernel stops being cheap: the run holds its ``(L, N, N)`` float64 sums
twice (the batch's and the total), ``config.kernels.npz`` stores it again
(64 MiB on disk per measurement), and every rollout, fit or sweep point
reads all of it (``L N^2`` per profile; an intervention forms a changed copy).
The line falls at N = 1448 for 4 layers, 836 for 12, 512 for 32: the
lengths at which measured kernels were validated (docs/measuring.md)."""


def dense_default(length: int | None, layers: int | None) -> bool:
    """Whether ``8 layers length^2 <= DENSE_DEFAULT_BYTES``; False when either is unknown (None)."""
    return length is not None and layers is not None and 8 * int(layers) * int(length) ** 2 <= DENSE_DEFAULT_BYTES


GAIN_GRID = tuple(float(2.0 ** (k / 2)) for k in range(-3, 5))
"""The logit gains ``attention_gains`` tabulates (`jaxroll.measure.gain_rows`), ``2^(k/2)`` for k = -3..4
(0.354 .. 4): tau from 0.25 to 2.8 and SSMax's ``s ln n_i`` up to 4 (s = 0.5 at N = 2981). On the wave-6
rotary validation model (N = 128, 48 sequences) this grid reproduces the closed-ratio prediction of the
per-sequence rows within 3 % of its size at tau = 0.7, 1.5 and SSMax 0.3, 0.5; a grid of factor 2 was up to
60 % off (docs/interventions.md, "Rows at every logit gain")."""


def gain_table_bytes(layers: int, length: int) -> int:
    """The bytes of ``attention_gains``' two float64 tables, ``2 L G N^2 8`` (G = len(`GAIN_GRID`))."""
    return 2 * int(layers) * len(GAIN_GRID) * int(length) ** 2 * 8


DISTANCE_GRID = (-2.0, -1.0, -0.5, -0.25, 0.25, 0.5, 1.0, 2.0)
"""The kappas ``attention_distances`` tabulates (`jaxroll.measure.distance_rows`; 0 is the mean attention
itself), spanning `jaxroll.interventions.DistanceBias`'s design box [-2, 2], denser near 0 where designs move."""

DISTANCE_FORMS = (("log1p", 2.0), ("unsquash", 2.0))
"""The distance forms ``(form, k)`` ``attention_distances`` tabulates: ``ln(1 + m)`` and Attributor's
unsquash coefficients at its default k = 2 (`jaxroll.interventions.DistanceScore`)."""


def distance_table_bytes(layers: int, length: int) -> int:
    """The bytes of ``attention_distances``' float64 tables, ``L F K N^2 8`` (F forms, K kappas): as many
    ``L N^2`` tables as ``attention_gains`` holds (16), so the same lengths fit."""
    return int(layers) * len(DISTANCE_FORMS) * len(DISTANCE_GRID) * int(length) ** 2 * 8


def gain_default(length: int | None, layers: int | None) -> bool:
    """Whether a model measures ``attention_gains`` (and ``attention_distances``) by default: its tables fit in
    `DENSE_DEFAULT_BYTES` (N <= 362 at 4 layers, 209 at 12, 128 at 32); False when either is unknown."""
    return length is not None and layers is not None and gain_table_bytes(layers, length) <= DENSE_DEFAULT_BYTES


def default_stats(position: str, length: int | None = None, layers: int | None = None) -> tuple[str, ...]:
    """What ``--stats`` is by default for a model whose positions enter as `position`, at N = `length`, L = `layers`.

    ``lambda, content, influence`` for ALiBi: its config.yaml is the ALiBi +
    content kernel the paper measures. A model whose positions are not ALiBi
    (rotary, learned) also measures its attention kernel, so that its
    config.yaml is a measured kernel rather than a flat ALiBi kernel that
    nobody measured: the dense mean ``attention`` (a `DenseKernel` config)
    while ``8 L N^2 <= DENSE_DEFAULT_BYTES`` (`dense_default`), else the mean
    attention by offset, ``attention_offsets`` (``O(L H N)``; a `TableKernel`
    config, `jaxroll.measure.offsets.offset_rollout_model`), which a long
    context can afford. Without `length` or `layers`: the offsets (the
    default at any N). Rotary models drop content, whose raw ``q.k`` the
    rotation changes. Where its tables are small (`gain_default`) every model also
    measures ``attention_gains``, the mean rows at a grid of logit gains, and ``attention_distances``, the
    mean rows under distance scores at a grid of kappa, and its config.yaml is a `GainTableKernel` (a
    temperature, SSMax or distance score then moves the rows as each sequence's rows move); an ALiBi
    model's an `AnchoredTableKernel`, the tables moving its ALiBi + content kernel.
    Every family ends with ``paths``
    (`jaxroll.measure.path_stats`): the probability path's share of each
    layer's branch, which config.yaml carries so that a temperature or SSMax
    is predicted by the extended layer (docs/design.md, "The probability
    path"); inside the pass on every sequence where its forward route applies
    (`jaxroll.measure.path_forward`, no backward pass), else after the pass
    on a few sequences (the backward route).
    """
    names = tuple(name for name in DEFAULT_STATS if not (position == "rope" and name in _NEEDS_RAW_QK))
    if position != "alibi":
        names += ("attention" if dense_default(length, layers) else "attention_offsets",)
    names += ("attention_gains", "attention_distances") if gain_default(length, layers) else ()
    return names + ("paths",)


def check_stats_allowed(stats, layer_map_name: str, position: str) -> None:
    """Refuse statistics that the architecture cannot give (from its config alone)."""
    if any(name in stats for name in _NEEDS_RAW_QK) and position == "rope":
        raise ConfigError(
            f"stats: content needs q.k as the logit sees it; {layer_map_name} rotates q and k after "
            f"the projection (rotary); allowed for it: {', '.join(allowed_stats(position))}"
        )
    from .families import FAMILIES

    refused = FAMILIES[layer_map_name].refused if layer_map_name in FAMILIES else {}
    for name in stats:
        if name in refused:  # a family's own refusals (jaxroll.measure.families)
            raise ConfigError(f"stats: {name} is not defined for {layer_map_name}: {refused[name]}")
        statistic = registered().get(name)
        missing = [other for other in (statistic.requires if statistic else ()) if other not in stats]
        if missing:
            raise ConfigError(f"stats: {name} needs {missing[0]} in the same run; allowed: add {missing[0]}")
        if statistic is not None and position not in statistic.positions:
            raise ConfigError(f"stats: {name} is not defined for {position} positions ({layer_map_name}); "
                              f"allowed for it: {', '.join(allowed_stats(position))}")


def allowed_stats(position: str) -> tuple[str, ...]:
    """The statistic names a model with this position encoding can give."""
    return tuple(name for name in statistic_names() if not (position == "rope" and name in _NEEDS_RAW_QK)
                 and (name not in registered() or position in registered()[name].positions))


def stats_bytes(stats, shape: Shapes, positions: int = 1) -> int:
    """Bytes of the float64 partial sums of `stats` (what a run holds and checkpoints)."""
    layers, heads, n, sequences = shape.layers, shape.heads, shape.length, shape.sequences
    needed = 0
    if "lambda" in stats:
        needed += 8 * sequences * layers
    if "influence" in stats:
        needed += 8 * (sequences * n + n + 2 * sequences)
    if "content" in stats:
        needed += 16 * layers * heads
    if "qk" in stats:
        kept = len(range(0, n, positions))
        needed += 8 * layers * heads * kept * kept
    if "attention" in stats:
        needed += 8 * layers * n * n
    for name in stats:
        statistic = registered().get(name)
        if statistic is not None and statistic.memory is not None:
            needed += int(statistic.memory(shape))
    return needed


def parse_stats(stats) -> tuple[str, ...]:
    """Statistic names from a sequence or a comma-separated string, checked."""
    if isinstance(stats, str):
        stats = [item.strip() for item in stats.split(",") if item.strip()]
    stats = tuple(dict.fromkeys(stats))
    names = statistic_names()
    unknown = [item for item in stats if item not in names]
    if unknown or not stats:
        raise ConfigError(f"stats: got {unknown[0] if unknown else 'nothing'!r}; allowed: a subset of {', '.join(names)}")
    return stats


def summary_lines(measurement) -> list[str]:
    """One line per registered statistic that `measurement` holds (its `Statistic.summary`)."""
    names = measurement.metadata.get("stats", [])
    return [registered()[name].summary(measurement.extra) for name in names
            if name in registered() and registered()[name].summary is not None]
