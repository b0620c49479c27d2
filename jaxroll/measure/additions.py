"""What `jaxroll.measure.measure` adds to a `Measurement` after its pass: rows of P_T, the refined rollout.

- rows (``queries``): the gradient influence on each query position ``q_k``
  of every sequence, ``influence_rows_per_sequence (S, K, N)``, and their
  normalised mean ``influence_rows (K, N)`` (`jaxroll.measure.rows`,
  `jaxroll.theory.rows.normalised_rows`), measured on the same sequences;
- the refined rollout (``refine``): the switches in ``metadata["refined"]``,
  its profile ``refined_profile`` (`write_measurement` writes it as
  ``refined.csv``) and, with rows, its rows ``refined_rows (K, N)`` in float64
  (`jaxroll.measure.refinements.refined_rows_from_arrays`);
- the layer paths (``paths``): per layer r_t, the branch's share and the
  path sums at the last row, from the hooked pass on every sequence (the
  forward route) or from their own passes on the first sequences, under the
  run's interventions (the backward route; `jaxroll.measure.path_stats`).
"""

from __future__ import annotations

__all__ = ["sink_count", "add_rows", "add_refined", "add_record", "add_paths"]


def sink_count(changes) -> int:
    """k of a `SinkTokens` among `changes` (0 without one): the model runs at ``N + k``."""
    from ..interventions import length_change

    sinks = length_change(changes)
    return 0 if sinks is None else sinks.num_sinks


def add_rows(result, model, token_ids, positions, *, progress: bool, target: str = "probability") -> None:
    """Rows of P_T measured on the same sequences (`target`: what they differentiate), into `result`."""
    from ..theory.rows import normalised_rows
    from .progress import Progress
    from .rows import influence_rows

    bar = Progress(len(token_ids), label="jaxroll measure --queries") if progress else None
    try:
        rows, positions = influence_rows(model, token_ids, positions, progress=bar, target=target)
    finally:
        if bar is not None:
            bar.close()
    result.extra.update(influence_rows_per_sequence=rows, influence_rows=normalised_rows(rows),
                        query_positions=positions)
    result.metadata["queries"] = [int(q) for q in positions]
    result.metadata["row_target"] = target


def add_record(result, record: dict) -> None:
    """The caller's entries of metadata.json (processes, device, the texts' protocol), after the measured ones."""
    result.metadata.update(record)


def add_refined(result, switches) -> None:
    """The refined rollout's switches (refined.csv is written from them) and, with rows, its rows."""
    from .refinements import refined_from_arrays, refined_rows_from_arrays

    result.metadata["refined"] = {"switches": list(switches), "file": "refined.csv"}
    if "query_positions" in result.extra:  # the refined rows beside the measured ones, float64
        result.extra["refined_rows"] = refined_rows_from_arrays(result.arrays(), switches,
                                                                result.extra["query_positions"])
        result.metadata["refined"]["rows"] = "refined_rows in measurement.npz"
    result.refined_profile = refined_from_arrays(result.arrays(), switches)


def add_paths(result, model, model_ids, *, patching=None, falcon_alibi: str = "once") -> None:
    """The ``paths`` statistic (`jaxroll.measure.path_stats`) on the first sequences the model ran, into `result`.

    `model_ids` are the ids the model ran (sinks in front, if any); the path
    sums come from the last row, under `patching` (the run's interventions).
    Where the forward route ran inside the pass (its sums are already in
    `result`), only its record is added; else the backward route runs here.
    """
    from .path_stats import forward_record, measure_paths, path_outputs

    if "path_per_sequence" in result.extra:  # the forward route ran inside the pass, on every sequence
        result.metadata["paths"] = forward_record(result.extra["path_per_sequence"], model_ids)
        return
    measured = measure_paths(model, model_ids, patching=patching, falcon_alibi=falcon_alibi)
    result.extra.update(path_outputs(measured["per_sequence"]))
    result.metadata["paths"] = measured["record"]
